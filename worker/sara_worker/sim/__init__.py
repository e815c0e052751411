"""The simulator, for benchmarks, tests and a scheduler tried without a model: synthetic pools
whose prompts carry a latent success rate (`pool`), the backend that plays their rollouts out
(`backend`, registered as ``sim``) and the verifier that reads the rewards back (`verifier`,
the ``sim`` task)."""
