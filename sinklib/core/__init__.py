"""The foundation: parameter checks (`params`), package data and the results folder (`resources`), the
calibration prompts (`data`), the one way into a model (`anatomy`), the model registry (`models`), the sink
probe and S (`probe`, `sink`), cache keys and checkpoints (`cache`) and the one training loop (`train`)."""
