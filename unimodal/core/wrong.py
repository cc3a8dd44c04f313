"""When an image or audio code counts as wrong: its decoded content differs beyond these thresholds (the id alone
does not say; docs/critique.md, "Wrong by decoded content"). Shared by the critic's training labels
(:mod:`unimodal.training.critic_labels`) and the content critic (:mod:`unimodal.inference.content`), which sit
side by side in the layers and so take them from here."""

IMAGE_THRESHOLD = 0.05  # mean |difference| over the code's patch, pixels in [0, 1]
AUDIO_THRESHOLD = 0.5  # mean |difference| of log-mel over the code's frames, in mel standard deviations
# The content critic counts another speech code as saying the same only when it decodes closer than this, stricter
# than the label's 0.5: mass on codes 0.3-0.5 away is the model's doubt, not agreement. Chosen on 128 validation clips
# in each voice set (docs/critique.md, "A stricter ear for the speech critic"); pictures keep the label's threshold.
AUDIO_ALIKE = 0.3
