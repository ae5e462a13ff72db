#!/usr/bin/env bash
# Make sure the system parts of the stack are present: Open MPI, parallel
# HDF5 (with its pkg-config file), the HDF5 tools, and Slurm + MUNGE for the
# local test cluster. On Debian/Ubuntu as root, missing parts are installed
# with apt-get; elsewhere (an HPC login node with `module load`) we only say
# exactly what is missing.
set -euo pipefail

want_cmds=(mpirun mpicc pkg-config h5dump)
slurm_cmds=(slurmctld slurmd sbatch srun scontrol munged)
missing=()
for c in "${want_cmds[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
if command -v pkg-config >/dev/null 2>&1 && ! pkg-config --exists hdf5-openmpi 2>/dev/null \
   && ! pkg-config --exists hdf5 2>/dev/null; then
  missing+=("parallel HDF5 (pkg-config hdf5-openmpi)")
fi
slurm_missing=()
for c in "${slurm_cmds[@]}"; do command -v "$c" >/dev/null 2>&1 || slurm_missing+=("$c"); done

if [ ${#missing[@]} -eq 0 ] && [ ${#slurm_missing[@]} -eq 0 ] && pkg-config --exists hdf5-openmpi 2>/dev/null; then
  echo "setup-system: Open MPI, parallel HDF5, HDF5 tools, Slurm and MUNGE present"
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup-system: installing system packages with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools pkg-config \
    slurm-wlm munge >/dev/null
  echo "setup-system: installed; $(mpirun --version | head -n1)"
  exit 0
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: missing and not installable here (not root on Debian/Ubuntu):" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  echo "On a cluster, load them first, e.g. 'module load openmpi hdf5/parallel'," >&2
  echo "then run 'make setup' again." >&2
  exit 1
fi
echo "setup-system: Slurm/MUNGE commands missing (${slurm_missing[*]}); the local-cluster tests will be skipped"
