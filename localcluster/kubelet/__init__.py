"""The node agent's kubelet: pure builders (images, envvars, volumes, launch, status,
node) at the bottom, the processes and the API on top (runtime, probes, logs, events,
pods). Only kubeapi.py talks to the API server; the pure modules import none of the others.
"""
