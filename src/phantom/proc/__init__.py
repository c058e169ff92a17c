"""Process plumbing shared by the lab and the book: how phantom starts the processes it runs.

``kernels`` (the batch kernels' IPython start-up), ``malloc`` (tcmalloc for the lab's processes),
``zygote`` and ``zygote_serve`` (kernels and papermill processes forked from a warm process). They sit
together because none of them computes anything: each changes how fast a process starts or runs, never
a number it logs (each module's tests check that). Stdlib only, so the CLI can use ``malloc`` before
importing anything heavy.
"""
