"""The error a checkpoint file raises when it cannot be read: `CheckpointError`."""


class CheckpointError(ValueError):
    """A checkpoint file (a `config.json`, a `*.safetensors` file, a GGUF file) is damaged or
    incomplete: not JSON, truncated, missing a tensor or a metadata key.

    The message names the file and what is wrong with it ("truncated", "not JSON", "missing key
    `gemma3.block_count`"); the library's own exception, where there was one, is kept as
    `__cause__`.
    """
