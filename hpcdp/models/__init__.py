"""Every network hpcdp trains: convnets (`vision`), the GPT (`gpt`), the DLRM click model
(`dlrm`). Plain torch modules: no Horovod, no data, no config beyond their shapes."""
