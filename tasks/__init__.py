"""Datasets, preprocessing and models: `get_task(name, TaskOptions(...))`."""

from tasks.base import Task, TaskError
from tasks.registry import TaskOptions, get_task, list_tasks, check_options
