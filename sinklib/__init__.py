"""sinklib: the helper package of sinkbook (attention-sink diagnosis of text-capability loss)."""
__version__ = "0.1.0"
