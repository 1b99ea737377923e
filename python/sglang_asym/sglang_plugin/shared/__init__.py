"""What both asymmetric roles share: the settings and command line, the launcher's refusals, SGLang's V4.1
pool as the payload sees it, the PD registration, the bootstrap room's protocol and the Mooncake counts."""
