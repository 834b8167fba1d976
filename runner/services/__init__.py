"""What a service runs (commands.py): TensorBoard over jobs' TensorBoard folders, Jupyter in a folder of the
box, both with the job interpreter. runner/handlers/services.py starts each as a job of its own kind.

Stands on: records, shim, home.
"""
