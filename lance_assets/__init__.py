"""GPT pretraining where one Lance table is the whole data layer and Dagster orchestrates it."""

__all__ = ["__version__"]

__version__ = "0.1.0"
