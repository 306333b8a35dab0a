"""Schedule Plans (seed 001 §8) and their choice for each region."""
from kumiko.plan.plan import Plan, make_plan

__all__ = ["Plan", "make_plan"]
