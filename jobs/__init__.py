"""Code that runs inside a training process, and example training jobs.

Imported by the job's own interpreter (Python 3.8 with TF 2.9 in the container, newer elsewhere), so it
uses nothing but the standard library and TensorFlow, in Python 3.8 syntax. tfrund puts a folder holding
only this package on every job's PYTHONPATH: nothing is installed into the job's interpreter.
"""
