"""Launch scripts for Megatron-LM from a parallel plan: torchrun and SLURM renderers.

``megatron_flags`` holds the one table from plan/model fields to Megatron-LM flags;
``torchrun`` and ``slurm`` render bash around it; ``bridge`` writes the plan as
Megatron-Bridge recipe overrides; ``files`` writes them (and the search's other outputs)
without following symbolic links.

May import ``configurator.core`` (the plan document and its placement record) and
``topology``, nothing of the search.
"""

from launchers.bridge import BRIDGE_FILE, bridge_overrides, render_bridge_overrides
from launchers.files import (FILE_MODE, SCRIPT_MODE, SLURM_FILE, TORCHRUN_FILE, check_out_dir,
                             check_out_file, launch_files, placement_kwargs,
                             start_instructions, write_files, write_launch_files,
                             write_text_file)
from launchers.megatron_flags import (FLAG_TABLE, MEGATRON_COMMIT, MEGATRON_TAG, ShellVar,
                                      TrainingArgs, megatron_flags)
from launchers.slurm import render_slurm_script
from launchers.torchrun import render_torchrun_script

__all__ = ["render_torchrun_script", "render_slurm_script", "write_launch_files",
           "launch_files", "placement_kwargs", "start_instructions", "write_files",
           "check_out_dir", "check_out_file",
           "write_text_file", "FILE_MODE",
           "SCRIPT_MODE",
           "megatron_flags", "FLAG_TABLE", "TrainingArgs", "ShellVar", "MEGATRON_TAG",
           "MEGATRON_COMMIT", "TORCHRUN_FILE", "SLURM_FILE", "BRIDGE_FILE", "bridge_overrides",
           "render_bridge_overrides"]
