"""Example third-party samplers gated by rs-verify (public types only): a torch sampler and broken copies."""
