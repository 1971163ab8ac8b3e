"""Host-local rollout: prompts in, scored completions out (DESIGN.md, "the step")."""
