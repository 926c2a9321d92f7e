"""Data: sources, GLUE tasks, tokenise-once encoding, samplers."""

from finetune_cli.data.encode import EncodedData, collate, encode_table, to_device
from finetune_cli.data.sampling import SAMPLERS, epoch_batches, sorted_batches
from finetune_cli.data.sources import Table, read_file
from finetune_cli.data.tasks import TaskData, data_dir_from_env, load_task_data

__all__ = ["SAMPLERS", "EncodedData", "Table", "TaskData", "collate", "data_dir_from_env", "encode_table",
           "epoch_batches", "load_task_data", "read_file", "sorted_batches", "to_device"]
