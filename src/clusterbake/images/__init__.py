"""Image building, in one place: one builder per target behind one interface
(`base.Builder`), and the image store (`store`) the providers find images in.

    store.py   where images and their records are: the local images' index (inputs
               digest -> image), manifests, and the records of cloud image ids
               (<state>/images/<cloud>-latest.json)
    inputs.py  what goes into an image (the inputs digest, the builder's groups)
    local.py   the local image: debootstrap base -> builder nspawn node -> packer null.local
    aws.py     the AWS image: packer amazon-ebs.ubuntu
    azure.py   the Azure image: packer azure-arm.ubuntu (managed image, gallery version)
    packer.py  the wrapper around the packer binary and its versions

Layering: nothing here imports clusterbake.providers, and providers import only
`store` (tests/unit/test_images_layering.py). This package's __init__ imports
nothing, so that importing the store does not import a builder.
"""
