"""Schedule Plans (seed 001 §8) and their choice for each region."""
from kumiko.plan.plan import Plan, ProgramPlan, make_plan

__all__ = ["Plan", "ProgramPlan", "make_plan"]
