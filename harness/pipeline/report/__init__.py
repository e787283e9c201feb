"""The drill's report: a short text summary, a JSON file, and a PNG timeline.

Times in a report are seconds since the publish started (``t = 0``), except ``phases``
(durations) and event timestamps (Unix seconds). Throughput is messages per second:
*publish* counts the SENDs the producer's sidecar relayed to the broker (sampled from its
``/metrics``), *consume* the messages the reading app received. With the outbox
(``--outbox``) *publish* counts the app's own SENDs instead (the writer's reports, as in the
baseline below): the sidecar takes them into its outbox whether or not a broker is up, and
its counters start again from 0 when it is killed and restarted; the outbox's depth is
sampled beside it. For each fault, the *during* window runs from the kill to the end of the
longest session outage the sidecars reported for it (for every broker down, ``--faults
all-down``, and for the producer's sidecar killed, ``--kill-sidecar``: until the service was
back, ``FaultRecord.restored_at``); *before* is everything up to the first kill, *after* the
rest.

With ``--baseline`` the report also has the baseline run (the same publish and drain straight
to the broker, no sidecar, no fault) and, per mode that ran between the apps and the broker
(``sidecar``, or ``outbox`` with ``--outbox``), an overhead: the mode's publish and consume
rates as a share of the baseline's, *overall* (the mode's whole run, kill, outage and replay
included) and *before the kill* (the mode's rate up to its first kill against the baseline's
rate over the same first share of the rows: the like-for-like figure). The baseline's
publish series is Spark's own progress (the rows of the publish job's finished tasks,
:class:`pipeline.publish.SparkProgress`), there being no sidecar to count the SENDs.

The modules, one section of the report each (none imports Spark, a broker or a sidecar):

* :mod:`pipeline.report.records`: the delivery counts, the faults made and the FAILOVERs
  they caused, as records;
* :mod:`pipeline.report.timeline`: the publish and consume series, and the throughput
  before, during and after the faults;
* :mod:`pipeline.report.outbox`: the producer sidecar's outbox over the drill, and what
  fails a drill with it;
* :mod:`pipeline.report.notes`: what happened around every broker down or the producer's
  sidecar killed, in words;
* :mod:`pipeline.report.overhead`: the baseline run and each mode's rates as its share;
* :mod:`pipeline.report.document`: :class:`~pipeline.report.document.DrillReport`, the
  whole report as JSON and as the printed text;
* :mod:`pipeline.report.png`: the timeline drawn as a PNG.
"""

from __future__ import annotations
