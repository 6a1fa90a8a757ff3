"""Text formats: the agent's action vocabulary, prompt templates from files, QA files."""
