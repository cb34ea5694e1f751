"""ft: fine-tune large language models from one declarative YAML recipe."""

__version__ = "0.1.0"
