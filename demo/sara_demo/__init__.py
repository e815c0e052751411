"""`sara demo`: scheduler, worker and trainer end to end on one CPU, SARA against Dynamic
Sampling (:mod:`sara_demo.demo`), with its synthetic task (:mod:`sara_demo.tasks`), its SFT warm
start (:mod:`sara_demo.sft`, :mod:`sara_demo.warmstart`) and its held-out evaluation
(:mod:`sara_demo.evaluate`). It sits above the trainer and worker libraries, which never import
it."""
