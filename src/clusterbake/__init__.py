"""clusterbake: bake HPC images with Packer and bootstrap Slurm clusters with Ansible."""

__version__ = "0.1.0"
