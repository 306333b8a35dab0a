"""Regions: kernel boundaries and each kernel's meaning as Region Buffer SSA (seed 001 §6)."""
from kumiko.region.form import form_regions
from kumiko.region.playback import play_program, play_region
from kumiko.region.ssa import Program, Region, typecheck

__all__ = ["Program", "Region", "form_regions", "play_program", "play_region", "typecheck"]

