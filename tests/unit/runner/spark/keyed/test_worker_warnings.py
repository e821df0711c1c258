"""pyspark's worker's empty-frame concatenation warning is silenced where Ember's keyed
functions run; other warnings, from it or elsewhere, are not."""

import warnings

from ember.runner.spark.keyed import EMPTY_CONCAT_WARNING, quiet_worker_warnings


def test_only_pysparks_empty_concat_warning_is_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_worker_warnings()
        warn = EMPTY_CONCAT_WARNING + " is deprecated."
        warnings.warn_explicit(warn, FutureWarning, "worker.py", 3771, module="pyspark.worker")
        warnings.warn_explicit("something else", FutureWarning, "worker.py", 3772, module="pyspark.worker")
        warnings.warn_explicit(warn, FutureWarning, "job.py", 1, module="user_job")
    assert [(str(w.message), w.filename) for w in caught] == [("something else", "worker.py"), (warn, "job.py")]
