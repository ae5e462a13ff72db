# hpcdp dataset preparation: every task writes its slab of the same HDF5 files
# through parallel HDF5 (MPI-IO), launched with srun and the site's MPI plugin.
#   sbatch --ntasks=4 slurm/prep.sbatch digits --out data/digits        # hpcdp prep ...
#   sbatch --ntasks=4 slurm/prep.sbatch datasets/digits.py --out data/digits
# A first argument ending in .py is a recipe script run on every rank; anything
# else is handed to `hpcdp prep`. Near its time limit the job requeues itself and
# the next run adds --resume. Environment (optional): HPCDP_VENV (venv to
# activate), HPCDP_SETUP (file to source first: module loads, exports),
# HPCDP_PYTHON (default python3), HPCDP_SRUN_MPI (default: the site's MpiDefault).
