"""Demo-test fixtures: the trainer tests' tiny GPT-2 policy and their one-torch-thread rule."""

from tests.trainer.conftest import one_torch_thread, tiny, tiny_dir  # noqa: F401 (fixtures)
