"""An in-process TFF backend: compiled computations run in this process's TF.

TFF 0.87's pip `worker_binary` embeds its own CPU-only TensorFlow. This
backend instead executes a federated computation in the Python process, so its
TensorFlow work runs on whatever devices the Python TensorFlow sees (GPUs
included), with no worker process, no gRPC and no (de)serialisation of values
or datasets per round.

It is a TFF executor under `InProcessContext` (`executor`), TFF's
`SyncExecutionContext` with a shorter way for the calls it can take: one
ingestion of the argument, the executor called directly, result containers
from converters built once per type. It receives the call-dominant
building-block tree that TFF's native compiler gives the C++ worker, minus that
compiler's static rewrites of the TensorFlow graphs (`compile_for_inprocess`),
and interprets it (`interpreter`):

* TensorFlow computations (`CompiledComputation`) are imported once
  (`graph_import`, after the rewrites of `graph_surgery`) into a
  `tf.compat.v1.wrap_function` and pruned to a concrete function from their
  parameter tensors to their result tensors; their `initialize_op` runs before
  every call, as in the C++ worker (with it run only once, model metrics
  accumulate across clients and the reported training loss differs);
* federated values at CLIENTS are Python lists (one entry per client, in
  order), at SERVER single values (`values`); datasets are passed as their
  variant tensors;
* a whole call (e.g. one round of a learning process) is interpreted once,
  while a function is traced, and is then ONE TensorFlow call per round
  (`tracing`; traced again for a new cohort size);
* computations that cannot be traced that way are interpreted call by call,
  with a `federated_map` of a TensorFlow computation, and an aggregation's
  `accumulate` fold, still run up to 16 clients per TensorFlow call
  (`tensorflow_function`);
* clients train concurrently: client k's training (a `federated_map` of a
  computation that takes datasets) runs on lane k mod `concurrent_clients`
  of its device, a lane being an import of that computation with variables of
  its own; calls of one lane are chained by control edges, and nothing else
  orders them (`tf_calls.trace_unordered`). Results do not depend on it.

Where the time of a round goes, and what each of these choices bought, is in
docs/performance.md.

With a GPU (`host_datasets`, on by default when TensorFlow sees one), the
client work runs on the GPU with its input pipeline on the host, as in TFF's
own C++ runtime: each computation that takes datasets gets the native
compiler's static Grappler pass (function inlining), its dataset, iterator and
optional ops are pinned to the CPU, each dataset is passed as its serialized
graph (a host string) and rebuilt on the CPU inside the computation, and such
computations run call by call (one eager call per client): a round whose
arguments hold datasets is then interpreted call by call (aggregation and
server update too), not traced. With several visible GPUs, client k's work is
placed on GPU k mod #GPUs (not tested with more than one GPU).
"""

from tff_algos.runtime.inprocess.executor import (InProcessContext, InProcessExecutor,
                                                  compile_for_inprocess,
                                                  create_context, default_concurrent_clients,
                                                  effective_concurrent_clients, gpu_devices)
from tff_algos.runtime.inprocess.interpreter import Interpreter
from tff_algos.runtime.inprocess.tensorflow_function import TensorFlowFunction
from tff_algos.runtime.inprocess.tracing import WholeCallTracer
