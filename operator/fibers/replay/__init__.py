"""Replay: a pipeline's steps moved back to a position in their streams, together and in order."""
