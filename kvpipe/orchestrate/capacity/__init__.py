"""hydra/sweeper=capacity: per cache, a walk of served jobs whose next point depends on the last
one's figures (a request-rate search for `kvpipe capacity`, a concurrency walk for `kvpipe advise
--objective throughput|goodput`), every cache still walking measured in one batch, taking turns."""
