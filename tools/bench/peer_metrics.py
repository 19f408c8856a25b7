"""The Python baselines' metrics file (accelerate_nlp.py, accelerate_lm.py):
<output_dir>/python_accelerate/metrics.jsonl in accel's JSONL tracker
format, written by the main process only, so that tools/plot_metrics draws
accel's and Python's runs alike.

  record = peer_metrics.recorder(accelerator, args.output_dir)
  record(step, {"loss": loss.item()})
"""

import json
import os
import time


def recorder(accelerator, output_dir):
    log = None
    if accelerator.is_main_process:
        folder = os.path.join(output_dir, "python_accelerate")
        os.makedirs(folder, exist_ok=True)
        log = open(os.path.join(folder, "metrics.jsonl"), "w")

    def record(step, values):
        if log is not None:
            log.write(json.dumps({"step": step, "values": values,
                                  "wall_time": time.time()}) + "\n")
            log.flush()
    return record
