"""One language model and one trainer on which every axis composes: dp x pp x tp x cp (and ZeRO,
sequence parallelism, recomputation), equal to one process step by step."""

from edulib.train.config import TrainConfig
from edulib.train.data import text_batch
from edulib.train.generate import generate_text
from edulib.train.gpt import gpt
from edulib.train.trainer import reference, train

__all__ = ["TrainConfig", "generate_text", "gpt", "reference", "text_batch", "train"]
