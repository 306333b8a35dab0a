"""Regions: kernel boundaries and each kernel's meaning as Region Buffer SSA (seed 001 §6)."""
from kumiko.region.form import form_regions
from kumiko.region.playback import play_program, play_region
from kumiko.region.ssa import Program, Region, typecheck

__all__ = ["Program", "Region", "form_regions", "play_program", "play_region", "typecheck"]


def _region_stage(program) -> dict:
    from kumiko.compiler import to_tiny
    from kumiko.region.serial import program_json
    return program_json(form_regions(to_tiny(program)))


def _register() -> None:
    from kumiko.frontend.visualize import register_drawing
    from kumiko.pipeline import register_stage
    from kumiko.region.draw import draw_program
    register_stage("region", _region_stage)
    register_drawing("region", draw_program)


_register()
