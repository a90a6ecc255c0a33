"""Text before the model: prompts, chat templates, conversations and candidate token ids."""
