"""The operator: kopf handlers around one pool's reconcile.

Modules, in the order a reconcile uses them:

- :mod:`~prescaler.controller.runtime`: the process (settings → pipeline → kopf).
- :mod:`~prescaler.controller.handlers`: the kopf handlers, thin.
- :mod:`~prescaler.controller.reconcile`: gather (I/O) → plan (pure) → apply (I/O).
- :mod:`~prescaler.controller.forecast` and :mod:`~prescaler.controller.fits`: forecasts
  shared per demand series, fitted off the reconcile path.
- :mod:`~prescaler.controller.prewarm`: warm-up of new pods (``spec.prewarm``): the pod
  watch's decisions, the warm-up tasks and the pods' ``prescaler.io/prewarmed`` condition.
- :mod:`~prescaler.controller.status`: the status, parsed and composed in one place.
- :mod:`~prescaler.controller.model`: the plain data passed between them.

Dependencies point one way: runtime → handlers → reconcile → forecast/prewarm → status
→ model.
"""
