"""Using a trained model outside training: export, load, generate, predict.

- `bundle`: the export folder's format (model.safetensors, config.json, tokenizer.json);
- `load`: `load(DIR) -> (eval-mode nn.Module, config)`, with no Horovod, MPI or HDF5;
- `command`: `hpcdp export (RUN_DIR | CHECKPOINT) --out DIR`, from a verified checkpoint;
- `sample`: autoregressive sampling from the GPT with a KV cache; `generate`: its command;
- `text`: token ids to text for the tokenizers token files are made with;
- `predict`: `hpcdp predict EXPORT_DIR FILES...`, image files through an image model.

Only `load`, `bundle`, `sample` and `text` may be imported where Horovod, MPI and h5py
must stay out (tests/unit/test_export_load.py checks sys.modules).
"""

from hpcdp.export.load import load

__all__ = ["load"]
