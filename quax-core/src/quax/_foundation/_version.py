"""The version of quax-core, which is `quax.__version__`.

quax-core continues the version line of the published `quax` package whose API it
implements: quax-core 0.5.x implements the published quax 0.4.x API (up to 0.4.6)
and adds to it. So clients that gate on `quax.__version__`, for example quaxed's
`Version(quax.__version__) >= Version("0.4")`, see at least the API they expect. A
release that breaks the 0.4.x API raises the minor version again. The families
(quax-lora, quax-units, ...) keep versions of their own, starting at 0.1.0, and each
requires the quax-core it was built against (`quax-core>=0.5.0`).
"""

__version__ = "0.5.0"
