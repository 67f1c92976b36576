"""GPT pretraining where one Lance table is the whole data layer and Dagster orchestrates it."""

__version__ = "0.1.0"
