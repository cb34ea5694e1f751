"""Recipes: schema, loading and rules. Imports nothing heavy (no torch, transformers or trl)."""

from .errors import Problem, RecipeError
from .load import LoadedRecipe, load_recipe
from .processes import Processes
from .schema import Recipe, recipe_model

__all__ = ["LoadedRecipe", "Problem", "Processes", "Recipe", "RecipeError", "load_recipe", "recipe_model"]
