"""What a consultation may spend: the estimate, the consent gate, and the pre-flight limits."""
