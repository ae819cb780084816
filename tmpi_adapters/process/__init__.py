"""One process of a job, below everything else: the shims old libraries need
(:mod:`.compat`, applied by the venv's start-up hook too), which rank it is
(:mod:`.rank`), its BLAS threads (:mod:`.threads`), where its output goes
(:mod:`.output`), the files it leaves for the launcher (:mod:`.jobdir`), and
how it reports a failure and ends the job (:mod:`.failure`).

Nothing here imports Theano, and the start-up hook imports :mod:`.compat`
alone, in every interpreter of the environment.
"""
