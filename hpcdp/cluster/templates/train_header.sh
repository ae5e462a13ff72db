# hpcdp training job. Arguments after the script name go to `python -m hpcdp.train`,
# or, after --script FILE [--], to a training script of your own (hpcdp.session):
#   sbatch [sbatch options] THIS_SCRIPT --config FILE key.sub=value ...
#   sbatch [sbatch options] THIS_SCRIPT --script my_train.py -- ARGS ...
# One rank per GPU (per task on CPU-only nodes or with --gpus-per-task), launched with
# srun and the site's MPI plugin. Environment (all optional): HPCDP_VENV (venv to
# activate), HPCDP_SETUP (file to source first: module loads, exports), HPCDP_PYTHON
# (interpreter, default python3), HPCDP_BATCH_PYTHON (the one that works out the layout
# in this shell; default HPCDP_PYTHON's, which must import hpcdp, or with a container,
# python3, which needs none: the script carries the layout), HPCDP_SRUN_MPI (srun --mpi
# plugin; default: the site's MpiDefault), HPCDP_SRUN_ARGS (extra srun options). NCCL,
# HDF5 and Horovod settings below are defaults: exported values win.
