"""The cluster GPU view: the map of who holds which card (pure), and the kubectl
plugin that shows it."""
