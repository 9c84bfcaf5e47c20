"""Structured output on worker rank 0: grammars compiled off the step path (`compiler.py`),
one matcher per constrained sample (`matchers.py`), and the glue that keeps them in step with
the sampled tokens and turns them into token masks for the sampler (`runtime.py`).
Why rank 0 holds them, and how the mask of step n+1 is ready without stalling the batch:
docs/applications.md."""
