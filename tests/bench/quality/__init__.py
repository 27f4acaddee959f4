"""The retrieval-quality benchmark: a seeded synthetic conversational-memory generator
(`generate`) and the retrieval metrics and plain baselines it is scored with (`metrics`)."""
