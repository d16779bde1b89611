"""Devices, threads, precision and the distribution strategy.

Must run before TensorFlow creates its runtime (the first op), which is why
`fit` calls `configure` first.
"""

import json
import os

import keras
import tensorflow as tf

from train import logs
from train.config import TrainConfig


def configure(config: TrainConfig) -> None:
  """Applies thread counts, GPU memory settings, logical CPUs, precision."""
  if config.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
  if config.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
  for gpu in tf.config.list_physical_devices("GPU"):
    if config.gpu_memory_limit_mb:
      tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=config.gpu_memory_limit_mb)]
      )
    elif config.memory_growth:
      tf.config.experimental.set_memory_growth(gpu, True)
  if config.cpu_replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * config.cpu_replicas
    )
  keras.mixed_precision.set_global_policy(config.mixed_precision or "float32")


def _cluster_workers() -> int:
  try:
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
  except json.JSONDecodeError:
    return 0
  return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def choose_strategy(config: TrainConfig) -> tf.distribute.Strategy:
  """MultiWorkerMirrored when TF_CONFIG names a cluster, Mirrored over several
  GPUs (or --cpu-replicas logical CPUs), else the default strategy."""
  log = logs.get()
  if _cluster_workers() > 1:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    log.info(
      "train: MultiWorkerMirroredStrategy, %d replicas in sync", strategy.num_replicas_in_sync
    )
    return strategy
  gpus = tf.config.list_logical_devices("GPU")
  if len(gpus) > 1:
    strategy = tf.distribute.MirroredStrategy([g.name for g in gpus])
    log.info("train: MirroredStrategy over %d GPUs", len(gpus))
    return strategy
  if config.cpu_replicas > 1:
    cpus = tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy(
      [c.name for c in cpus], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    log.info("train: MirroredStrategy over %d logical CPU devices", len(cpus))
    return strategy
  log.info("train: one device (%s)", gpus[0].name if gpus else "CPU")
  return tf.distribute.get_strategy()


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True
  return resolver.task_type == "chief" or (
    resolver.task_type == "worker"
    and resolver.task_id == 0
    and "chief" not in resolver.cluster_spec().as_dict()
  )
