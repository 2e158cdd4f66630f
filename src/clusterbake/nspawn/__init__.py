"""systemd-nspawn machines and their host networking (PLATFORM.md).

Below both the local image builder (clusterbake.images.local: the builder node)
and the local provider (clusterbake.providers.local: the cluster's nodes); the
twins use them too. Nothing here imports a provider or an image builder.
"""
