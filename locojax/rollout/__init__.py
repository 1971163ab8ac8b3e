"""Host-local rollout: prompts in, scored completions out (docs/design.md, "the step")."""
