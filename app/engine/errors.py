"""Errors of the engine layer. Each message names the file or field at fault."""


class EngineError(Exception):
    """A model folder cannot be loaded or a request cannot be served."""


class KvPoolFull(EngineError):
    """The KV pool cannot hold the request's tokens."""
