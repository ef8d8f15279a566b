"""MAX's ``max.entrypoints``: `llm.LLM`, offline generation through the serving engine."""
