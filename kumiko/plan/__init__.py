"""Schedule Plans (seed 001 §8) and their choice for each region."""
from kumiko.plan.plan import CacheBlock, Plan, RegisterBlock, make_plan

__all__ = ["CacheBlock", "Plan", "RegisterBlock", "make_plan"]
