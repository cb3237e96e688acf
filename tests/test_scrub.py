"""Secret scrubbing: each secret type is redacted and counted once; ordinary text is left alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conclave.scrub as scrub_module
from conclave.scrub import _RULES, ScrubReport, _plain_value, load_token_rules, scrub
from conclave.testing.secret_corpus import NEGATIVES, POSITIVES

# Fake secrets with the real shapes (random-looking, never issued).
OPENAI_PROJECT = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z_Ab7dEf0hIj3kLm6n-Op9qRs2tUv5wXy8zAb1dEf4h"
OPENAI_LEGACY = "sk-" + "T7qXk2Lm9Pw4Rz8Nc3Vb6Hd1Jf5Gs0Ya2Ue7Io4Kl9Mn3Bv8Cx"
ANTHROPIC = "sk-ant-api03-" + "Zx8Cv7Bn6Mq5Wl4Ek3Rt2Yu1Io0Pa9Sd8Fg7Hj6Kl5Zx4Cv3Bn2Mq1We0Rt9Yu8Io7Pa6SdAA"
GEMINI = "AIzaSyD4mX9kP2vQ7wR1tY6uI3oP8aS5dF0gH2j"
XAI = "xai-" + "k3J9sL2qP8wE5rT1yU7iO4pA6sD0fG3hJ9kL2zX8cV5bN1mQ7wE4rT6yU0iO3pA9sD5fG2hJ8kL1zX7cV4b"
MISTRAL = "Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB_CLASSIC = "ghp_" + "R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3s0n1y"
GITHUB_FINE = "github_pat_" + "11ABCDEFG0a1b2c3d4e5f6_" + "g7h8i9j0k1l2m3n4o5p6q7r8s9t0u1v2w3x4y5z6A7B8C9D0E1F2G3H4I5J6K7L8"
SLACK = "xoxb-" + "2468013579-1357924680123-Zq8Wx7Ec6Rv5Tb4Yn3Um2Ik"
STRIPE = "sk_live_" + "51HqT9kLmN3pQ7rS2tU8vW4x"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
RAILS_SECRET_KEY_BASE = (
    "9c1f0e8a7b6d5c4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e"
    "9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a"
)
GITLAB_TOKEN = "glpat-" + "xY3kP9mQ2vL7nR4tW8zB"
PEM = """-----BEGIN RSA PRIVATE KEY-----
MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB
aNu0SnUflDZ1HRCjQ5b7pQ0dG6S1i8xEDx1Vq3kzZ0b1wn9yXmE2CTXrOuf0w6xV
-----END RSA PRIVATE KEY-----"""


@pytest.mark.parametrize(
    ("text", "expected", "kind"),
    [
        (f"export OPENAI_API_KEY={OPENAI_PROJECT}", "export OPENAI_API_KEY=[REDACTED_OPENAI_KEY]", "openai_key"),
        (f"client = OpenAI(api_key='{OPENAI_LEGACY}')", "client = OpenAI(api_key='[REDACTED_OPENAI_KEY]')",
         "openai_key"),
        (f"ANTHROPIC_API_KEY={ANTHROPIC}", "ANTHROPIC_API_KEY=[REDACTED_ANTHROPIC_KEY]", "anthropic_key"),
        (f"https://generativelanguage.googleapis.com/v1beta/models?key={GEMINI}",
         "https://generativelanguage.googleapis.com/v1beta/models?key=[REDACTED_GOOGLE_API_KEY]", "google_api_key"),
        (f'XAI_API_KEY="{XAI}"', 'XAI_API_KEY="[REDACTED_XAI_KEY]"', "xai_key"),
        (f"MISTRAL_API_KEY={MISTRAL}", "MISTRAL_API_KEY=[REDACTED_MISTRAL_KEY]", "mistral_key"),
        (f"aws_access_key_id = {AWS_ID}", "aws_access_key_id = [REDACTED_AWS_ACCESS_KEY_ID]", "aws_access_key_id"),
        (f"aws_secret_access_key = {AWS_SECRET}", "aws_secret_access_key = [REDACTED_AWS_SECRET_KEY]",
         "aws_secret_key"),
        (f"git clone https://{GITHUB_CLASSIC}@github.com/acme/billing.git",
         "git clone https://[REDACTED_GITHUB_TOKEN]@github.com/acme/billing.git", "github_token"),
        (f"GH_TOKEN={GITHUB_FINE}", "GH_TOKEN=[REDACTED_GITHUB_TOKEN]", "github_token"),
        (f"slack:\n  bot_token: {SLACK}\n", "slack:\n  bot_token: [REDACTED_SLACK_TOKEN]\n", "slack_token"),
        (f"stripe.api_key = '{STRIPE}'", "stripe.api_key = '[REDACTED_STRIPE_KEY]'", "stripe_key"),
        (f"deploy key:\n{PEM}\nend", "deploy key:\n[REDACTED_PRIVATE_KEY]\nend", "private_key"),
        ("DATABASE_URL=postgres://billing:s3cr3t-P%40ss@db.internal:5432/billing",
         "DATABASE_URL=postgres://billing:[REDACTED_URL_PASSWORD]@db.internal:5432/billing", "url_password"),
        ("redis://default:Hx92kLq0@cache:6379/0", "redis://default:[REDACTED_URL_PASSWORD]@cache:6379/0",
         "url_password"),
        ("password=hunter22", "password=[REDACTED_PASSWORD]", "password"),
        ('DB_PASSWORD: "correct horse battery staple"', 'DB_PASSWORD: "[REDACTED_PASSWORD]"', "password"),
        ('{"client_secret": "9f8e7d6c5b4a", "user": "ops"}', '{"client_secret": "[REDACTED_SECRET]", "user": "ops"}',
         "secret"),
        ("api_key = 'q8w7e6r5t4y3'", "api_key = '[REDACTED_API_KEY]'", "api_key"),
        ("SENTRY_AUTH_TOKEN=f1e2d3c4b5a697887766", "SENTRY_AUTH_TOKEN=[REDACTED_TOKEN]", "token"),
        ("refreshToken: 0a9b8c7d6e5f4a3b", "refreshToken: [REDACTED_TOKEN]", "token"),
        ("curl -H 'Authorization: Bearer 3q9Zx7Lm2Kp8Vw4Rt6Yu1Io5'",
         "curl -H 'Authorization: Bearer [REDACTED_BEARER_TOKEN]'", "bearer_token"),
        (f"Authorization: Bearer {JWT}", "Authorization: Bearer [REDACTED_JWT]", "jwt"),
        (f"session cookie {JWT}; path=/", "session cookie [REDACTED_JWT]; path=/", "jwt"),
        # Names with a secret word other than at the end, or ending in "pass", "_KEY", "credentials", "private".
        ("DB_PASS=Xk9mQ2vLp7", "DB_PASS=[REDACTED_PASSWORD]", "password"),
        ('smtp:\n  pass: "s3nd-M41l"\n', 'smtp:\n  pass: "[REDACTED_PASSWORD]"\n', "password"),
        ("SIGNING_KEY=3f9a1c7e5b2d8046a1f3c5e7b9d0f2a4", "SIGNING_KEY=[REDACTED_SECRET]", "secret"),
        ('const signingKey = "q8W7e6R5t4Y3u2I1";', 'const signingKey = "[REDACTED_SECRET]";', "secret"),
        ("APP_KEY=base64:Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA==", "APP_KEY=[REDACTED_SECRET]", "secret"),
        ("SECRET_KEY = 'django-insecure-7x#k2@9m!q4z'", "SECRET_KEY = '[REDACTED_SECRET]'", "secret"),
        (f"SECRET_KEY_BASE={RAILS_SECRET_KEY_BASE}", "SECRET_KEY_BASE=[REDACTED_SECRET]", "secret"),
        (f"production:\n  secret_key_base: {RAILS_SECRET_KEY_BASE}\n",
         "production:\n  secret_key_base: [REDACTED_SECRET]\n", "secret"),
        (f"PRIVATE_TOKEN={GITLAB_TOKEN}", "PRIVATE_TOKEN=[REDACTED_GITLAB_TOKEN]", "gitlab_token"),
        ("REGISTRY_CREDENTIALS=ci-bot:9Yp3Lk7Qw2Zr", "REGISTRY_CREDENTIALS=[REDACTED_SECRET]", "secret"),
        ('"private_key_id": "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b",', '"private_key_id": "[REDACTED_SECRET]",',
         "secret"),
        ('headers = {"X-Api-Key": "a1b2c3d4e5f6g7h8"}', 'headers = {"X-Api-Key": "[REDACTED_API_KEY]"}', "api_key"),
    ],
)
def test_each_secret_type_is_redacted_once_under_its_own_type(text: str, expected: str, kind: str) -> None:
    scrubbed, report = scrub(text)
    assert scrubbed == expected
    assert report.by_type == {kind: 1}
    assert report.total == 1


@pytest.mark.parametrize(
    "text",
    [
        "Should we move billing to event sourcing? The team knows Postgres well and the audit trail matters.",
        "Request 550e8400-e29b-41d4-a716-446655440000 failed; retry with idempotency key 123e4567-e89b-12d3.",
        "Regression introduced in 3f786850e387550fdab836ed7e6dc881de23001b, fixed by commit a94a8fe5ccb19ba61c4c.",
        "Our password policy requires 12 characters; rotate the token every 90 days and never log the api key.",
        "Password: must be at least twelve characters long.",
        "The bearer of this letter speaks for the board.",
        "We use scikit-learn and a risk-assessment-framework-2024-revision for scoring.",
        "max_tokens = 1000\ntoken_count: 512\npassword_policy: strict\ninput_tokens=4096",
        'token = request.headers.get("X-Token")\npassword = os.environ["DB_PASSWORD"]\nif password == expected:',
        "password: ${DB_PASSWORD}\napi_key: <your-key-here>\nsecret: null\ntoken = self.token",
        "See https://example.com:8080/docs and user@example.com for details.",
        "AKIA is the prefix of AWS access key ids; sk- prefixes OpenAI keys.",
        '{"tokens_used": 12450, "tokens_saved_via_filtering": 3200, "efficiency_percentage": 20.4}',
        # Names that mention a secret word but hold settings about secrets, counts, paths, URLs or identifiers.
        "KEY_COUNT=3",
        "TOKEN_LIMIT=4096\nmax_tokens: 100000000\ntoken_ttl_seconds: 86400",
        "password_policy: strict requirements apply",
        '{"password_policy": "strict requirements apply", "password_min_length": 12}',
        "Persistence is the secret key to success; the private keys stay in the vault.",
        "PASSWORD_HASHER=argon2id\npassword_hash_algorithm: argon2id",
        "sort_key: created_at\nPRIMARY_KEY=customer_id\nCACHE_KEY=user:{id}:v2",
        "GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/service-account.json\nPRIVATE_KEY_PATH=./certs/server.pem",
        '"token_uri": "https://oauth2.googleapis.com/token",\nTOKEN_URL=https://oauth2.googleapis.com/token',
        "TOKENIZER=cl100k_base\nkeyboard_layout: dvorak-intl2\nMONKEY_PATCH=enabled123\nPASSENGER_NAME=Johnathan99",
        "is_private: false\nbypass_cache=true\nsecret_name: prod/billing/db-credentials",
        # A cache key made of words and numbers is not a generated secret.
        "cache_key = user:123:profile\nsession_key: orders/2024/summary",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scrub(text) == (text, ScrubReport())


def test_mistral_key_needs_its_assignment_context() -> None:
    # 32 random alphanumerics are not recognisable as a Mistral key on their own.
    assert scrub(f"build id {MISTRAL}")[1].total == 0


def test_already_redacted_spans_are_untouched() -> None:
    text = "OPENAI_API_KEY=[REDACTED_OPENAI_KEY] and postgres://app:[REDACTED_URL_PASSWORD]@db/x password=[REDACTED_X]"
    assert scrub(text) == (text, ScrubReport())


def test_a_document_with_many_secrets_counts_each_by_type() -> None:
    doc = "\n".join(
        [
            f"OPENAI_API_KEY={OPENAI_PROJECT}",
            f"ANTHROPIC_API_KEY={ANTHROPIC}",
            f"GEMINI_API_KEY={GEMINI}",
            f"AWS_ACCESS_KEY_ID={AWS_ID}",
            f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
            "DB_PASSWORD=Tr0ub4dor&3",
            "DATABASE_URL=mysql://root:rootpw42@localhost/app",
            "REDIS_PASS=Rd5-xK2mQ9",
            f"SECRET_KEY_BASE={RAILS_SECRET_KEY_BASE}",
            "WEBHOOK_SIGNING_KEY=whsec_4fK9mQ2vL7nR3tW8",
            f"GITLAB_PRIVATE_TOKEN={GITLAB_TOKEN}",
            "TOKEN_LIMIT=4096",
            "KEY_COUNT=3",
        ]
    )
    scrubbed, report = scrub(doc)
    assert report.as_dict() == {
        "total": 11,
        "by_type": {
            "anthropic_key": 1, "aws_access_key_id": 1, "aws_secret_key": 1, "gitlab_token": 1, "google_api_key": 1,
            "openai_key": 1, "password": 2, "secret": 2, "url_password": 1,
        },
    }
    for secret in (OPENAI_PROJECT, ANTHROPIC, GEMINI, AWS_ID, AWS_SECRET, "Tr0ub4dor", "rootpw42", "Rd5-xK2mQ9",
                   RAILS_SECRET_KEY_BASE, "whsec_4fK9mQ2vL7nR3tW8", GITLAB_TOKEN):
        assert secret not in scrubbed
    assert "TOKEN_LIMIT=4096\nKEY_COUNT=3" in scrubbed
    assert "mysql://root:" in scrubbed  # the user name is kept as context


def test_report_never_contains_a_value() -> None:
    _, report = scrub(f"key {OPENAI_PROJECT} and password=hunter22")
    serialised = json.dumps(report.as_dict())
    assert OPENAI_PROJECT not in serialised and "hunter22" not in serialised


def test_merge_adds_counts_per_type() -> None:
    merged = ScrubReport({"jwt": 1, "password": 2}).merge(ScrubReport({"password": 1, "openai_key": 1}))
    assert merged.as_dict() == {"total": 5, "by_type": {"jwt": 1, "openai_key": 1, "password": 3}}


_SAMPLES = [OPENAI_PROJECT, ANTHROPIC, GEMINI, XAI, AWS_ID, GITHUB_CLASSIC, SLACK, STRIPE, JWT, PEM,
            "password=hunter22", "Bearer 3q9Zx7Lm2Kp8Vw4Rt6Yu1Io5", "https://u:pw12345@h/x", f"MISTRAL_API_KEY={MISTRAL}",
            "DB_PASS=Xk9mQ2vLp7", "SIGNING_KEY=3f9a1c7e5b2d8046", f"SECRET_KEY_BASE={RAILS_SECRET_KEY_BASE}",
            f"PRIVATE_TOKEN={GITLAB_TOKEN}", "TOKEN_LIMIT=4096"]


@given(st.lists(st.one_of(st.sampled_from(_SAMPLES), st.text(alphabet=" abcdefgh.,:=\n", max_size=12)), max_size=12))
def test_scrubbing_is_idempotent(parts: list[str]) -> None:
    once, _ = scrub(" ".join(parts))
    assert scrub(once) == (once, ScrubReport())


def test_assignments_are_found_on_any_line_of_a_long_document() -> None:
    lines = [f"line {i}: nothing to see here, key facts only" for i in range(2_000)]
    lines[1_234] = '    "db_password": "Tr0ub4dor&3",'
    lines[1_500] = "export API_KEY=q8w7e6r5t4y3 # and token: 7f3a9c01e5"
    scrubbed, report = scrub("\n".join(lines))
    assert report.by_type == {"password": 1, "api_key": 1, "token": 1}
    assert scrubbed.splitlines()[1_234] == '    "db_password": "[REDACTED_PASSWORD]",'
    assert scrubbed.splitlines()[1_500] == "export API_KEY=[REDACTED_API_KEY] # and token: [REDACTED_TOKEN]"


def test_text_whose_lowercase_changes_length_is_still_scrubbed() -> None:
    # "İ" lower-cases to two characters, so line positions found in the lowered text would be off by one.
    assert scrub("İstanbul office\nAPI_KEY=q8w7e6r5t4y3")[0] == "İstanbul office\nAPI_KEY=[REDACTED_API_KEY]"


# Runs of what the rules' patterns repeat (word characters, separators, prefixes, secret words, operators), about
# 1 MB each, with what scrubbing them must give. Unbounded quantifiers after a word boundary once made 40 kB of
# "a.a.a." take minutes: backtracking made the work quadratic (or worse) in the length of such a run.
_PATHOLOGICAL = [
    ("a.", 500_000, None), ("ab-", 350_000, None), ("sk-", 350_000, None), ("x://", 250_000, None),
    ("password", 125_000, None), ("Bearer ", 150_000, None), ("pass_", 200_000, None), ("a_key", 200_000, None),
    ("password: ", 100_000, None), ("secret_key_base=", 62_500, None),
    ("token=", 170_000, "token=[REDACTED_TOKEN]"),  # one assignment whose value is the rest of the line
    ("-----BEGIN RSA PRIVATE KEY-----\n", 32_000, None), ("eyJ-", 250_000, None), ("a:b@", 250_000, None),
    ("machine a login b ", 55_000, None), ("Private-Lines: 1\n", 60_000, None),
]
_SCRUB_IN_CHILD = """
import json, sys
from conclave.scrub import scrub
unit, repeat = sys.argv[1], int(sys.argv[2])
scrubbed, report = scrub(unit * repeat)
print(json.dumps({"text": scrubbed, "by_type": dict(report.by_type)}))
"""


@pytest.mark.parametrize(("unit", "repeat", "expected"), _PATHOLOGICAL, ids=[unit for unit, _, _ in _PATHOLOGICAL])
def test_pathological_input_is_scrubbed_without_catastrophic_backtracking(unit: str, repeat: int,
                                                                          expected: str | None) -> None:
    # The child process and its timeout are a hang guard, not a speed assertion (speed is measured in bench/, not
    # asserted in tests): scrubbing 1 MB is linear work, and 120 s is far beyond any machine's time for it, so
    # only a regex that backtracks catastrophically makes this fail, with a TimeoutExpired instead of a hung suite.
    done = subprocess.run([sys.executable, "-c", _SCRUB_IN_CHILD, unit, str(repeat)], capture_output=True,
                          text=True, check=True, timeout=120)
    result = json.loads(done.stdout)
    assert result["text"] == (unit * repeat if expected is None else expected)
    assert result["by_type"] == ({} if expected is None else {"token": 1})


# ------------------------------------------------------------------------------------------ corpus goals

def test_recall_on_the_documented_formats_is_at_least_95_percent() -> None:
    missed = [p.name for p in POSITIVES if any(secret in scrub(p.text)[0] for secret in p.secrets)]
    print(f"caught {len(POSITIVES) - len(missed)}/{len(POSITIVES)} formats; missed: {missed}")
    assert len(POSITIVES) >= 76
    assert 1 - len(missed) / len(POSITIVES) >= 0.95, missed


def test_false_positives_on_look_alikes_are_at_most_2_percent() -> None:
    changed = [n.name for n in NEGATIVES if scrub(n.text)[0] != n.text]
    print(f"changed {len(changed)}/{len(NEGATIVES)} look-alikes: {changed}")
    assert len(NEGATIVES) >= 50
    assert len(changed) / len(NEGATIVES) <= 0.02, changed


@pytest.mark.parametrize(
    "name",
    ["Hugging Face token with digits", "Replicate API token", "Telegram bot token in a Bot API URL",
     "Discord bot token", "Discord bot authorization header", "Dropbox short-lived access token",
     "Dropbox short-lived access token, sl.u. shape", "Sentry DSN", "Sentry DSN with its legacy secret",
     "Sentry organization auth token", "Sentry user token", "FCM legacy server key", "Expo push token",
     "Pusher Channels app secret", "OneSignal REST API key", "age secret key", "age identity file"],
)
def test_each_format_issue_23_names_is_redacted(name: str) -> None:
    # model hubs, chat bots, file sharing, error tracking, push notifications, file encryption
    (positive,) = [p for p in POSITIVES if p.name == name]
    scrubbed, report = scrub(positive.text)
    assert report.total >= 1
    for secret in positive.secrets:
        assert secret not in scrubbed


def test_a_documented_key_shown_masked_is_left_alone() -> None:
    for text in ('client = OpenAI(api_key="sk-xxxxxxxxxxxxxxxxxxxxxxxx")', "api_key: 'sk-proj-XXXXXXXXXXXX'"):
        assert scrub(text) == (text, ScrubReport()), text


@pytest.mark.parametrize(
    "name",
    ["GitLab runner authentication token", "Slack incoming webhook URL", "SendGrid API key", "Twilio API key",
     "Hugging Face user token", "Vault service token", "DigitalOcean personal access token",
     "HTTP Basic authorization header", ".netrc password", "Docker config.json auths", "curl -u user:password",
     "mysql -p password", "sshpass -p password", "Redis URL with a password and no user", "Go MySQL DSN",
     "PuTTY private key"],
)
def test_each_format_the_issue_names_is_redacted(name: str) -> None:
    (positive,) = [p for p in POSITIVES if p.name == name]
    scrubbed, report = scrub(positive.text)
    assert report.total >= 1
    for secret in positive.secrets:
        assert secret not in scrubbed


def test_a_flag_or_url_template_is_not_a_password() -> None:
    for text in ("mysql -u root -p shop", "ssh -p 2222 host", "docker run -u 1000:1000 app",
                 "postgres://app:${DB_PASSWORD}@db/app", 'fmt.Sprintf("%s:%s@tcp(%s)/%s", u, p, h, d)'):
        assert scrub(text) == (text, ScrubReport()), text


def test_a_private_key_header_quoted_in_prose_is_left_alone() -> None:
    text = "A PEM key file starts with -----BEGIN RSA PRIVATE KEY----- and ends with its END line."
    assert scrub(text) == (text, ScrubReport())


def test_an_unterminated_private_key_is_redacted_up_to_the_end_of_its_key_lines() -> None:
    body = "\n".join(["MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB"] * 3)
    scrubbed, report = scrub(f"pasted:\n-----BEGIN RSA PRIVATE KEY-----\n{body}\nWhat is wrong with it?")
    assert scrubbed == "pasted:\n[REDACTED_PRIVATE_KEY]\nWhat is wrong with it?"
    assert report.by_type == {"private_key": 1}


# -------------------------------------------------------------------------- values conclave itself holds

def test_a_known_key_value_is_redacted_whatever_its_shape() -> None:
    key = "Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc"  # a Mistral key has no prefix
    scrubbed, report = scrub(f"our build id is {key}, see {key[:8]}", [key])
    assert scrubbed == f"our build id is [REDACTED_PROVIDER_KEY], see {key[:8]}"
    assert report.by_type == {"provider_key": 1}


# ------------------------------------------------------------------------------------------- the rules

def test_every_token_rule_compiles_names_its_keywords_in_lower_case_and_has_a_unique_id() -> None:
    import tomllib
    from importlib import resources

    specs = tomllib.loads(resources.files("conclave").joinpath("scrub_rules.toml").read_text())["rules"]
    assert len(load_token_rules()) == len(specs) >= 50
    assert len({spec["id"] for spec in specs}) == len(specs)
    for spec in specs:
        # a rule runs where its keywords are, or (a format with no literal to look for) where its guard finds
        assert bool(spec.get("keywords")) != bool(spec.get("guard")), spec["id"]
        assert all(k == k.lower() for k in spec.get("keywords", ())), spec["id"]
        assert re.compile(spec["regex"]).groups >= 0


def test_an_unknown_check_in_a_rule_file_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown require"):
        load_token_rules('[[rules]]\nid = "x"\nkind = "x"\nregex = "x"\nkeywords = ["x"]\nrequire = ["vibes"]\n')


# Inputs that once made a rule rescan what an earlier attempt had scanned. Eight times the input must take about
# eight times the CPU time (linear), not sixty-four (quadratic). Both sizes are scrubbed in turn, three times, and
# the best CPU time of each kept, so load from other processes affects both alike; the bound (24x) is generous and
# still far below quadratic growth. Times are only compared with each other, never with a fixed limit.
_SCALING = {
    "BEGIN PRIVATE KEY lines without END": "-----BEGIN RSA PRIVATE KEY-----\n",
    "BEGIN with key lines, END far away": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n",
    "JWT prefixes": "eyJ-",
    "URL user info": "a:b@",
    "names and colons": "password: ",
    "curl flags": "curl -u a:",
}


def _cpu_seconds(text: str) -> float:
    started = time.process_time()
    scrub(text)
    return time.process_time() - started


@pytest.mark.parametrize("unit", list(_SCALING.values()), ids=list(_SCALING))
def test_scrubbing_time_grows_linearly_with_the_input(unit: str) -> None:
    size = 64 * 1024
    small = (unit * (size // len(unit) + 1))[:size]
    large = (unit * (8 * size // len(unit) + 1))[: 8 * size]
    best_small = best_large = float("inf")
    for _ in range(3):
        best_small = min(best_small, _cpu_seconds(small))
        best_large = min(best_large, _cpu_seconds(large))
    ratio = best_large / max(best_small, 1e-4)
    assert ratio < 24, f"8x the input took {ratio:.1f}x the CPU time"


def test_the_rules_only_run_where_their_keywords_occur() -> None:
    # Without any rule's keyword (and no assignment), no rule runs: scrubbing is the keyword search alone.
    keywords = {keyword for rule in _RULES for keyword in rule.keywords}
    text = "plain words only " * 10
    assert not any(keyword in text.lower() for keyword in keywords if len(keyword) > 2)
    assert scrub(text) == (text, ScrubReport())


# ------------------------------------------------------------------------------ text dense with matches
# A window with many matches is rewritten in one pass (checks once per distinct value) instead of match by match:
# the result and the counts must be the same as for the same secrets spread out.

def test_a_line_dense_with_dsns_is_fully_redacted_and_counted() -> None:
    scrubbed, report = scrub("app:s3cret@tcp(db:3306)/x " * 1_000)
    assert scrubbed == "app:[REDACTED_URL_PASSWORD]@tcp(db:3306)/x " * 1_000
    assert report.by_type == {"url_password": 1_000}


def test_a_dense_line_redacts_the_accepted_matches_and_keeps_the_refused_ones() -> None:
    # "-u 1000:1000" is a uid:gid, not a password; both kinds repeat many times on one curl line
    scrubbed, report = scrub("curl " + "-u a:pw5678 -u 1000:1000 " * 400)
    assert scrubbed == "curl " + "-u a:[REDACTED_PASSWORD] -u 1000:1000 " * 400
    assert report.by_type == {"password": 400}


def test_a_dense_rewrite_leaves_spans_redacted_by_an_earlier_rule_alone() -> None:
    # few keys (recorded as edits), then many DSNs (rewritten in one pass): a key inside a DSN stays a key
    key = "sk-proj-" + "Ab3" * 10
    scrubbed, report = scrub(f"u:{key}@tcp(h)/d " * 100 + "u:pw@tcp(h)/d " * 300)
    assert scrubbed == "u:[REDACTED_OPENAI_KEY]@tcp(h)/d " * 100 + "u:[REDACTED_URL_PASSWORD]@tcp(h)/d " * 300
    assert report.by_type == {"openai_key": 100, "url_password": 300}


def test_a_command_line_password_counts_only_after_its_command() -> None:
    assert scrub("sshpass -p hunter22 ssh host")[0] == "sshpass -p [REDACTED_PASSWORD] ssh host"
    assert scrub("ssh -p 2222 host; echo -p hunter22")[1].total == 0  # no sshpass on the line
    assert scrub("-pSecr3t99 then mysql")[1].total == 0  # the flag comes before the command
    long_line = "curl " + "-H 'X: y' " * 80 + "-u admin:Secr3t99 https://h"  # far beyond 512 characters
    assert "Secr3t99" not in scrub(long_line)[0]


def test_every_token_rule_stays_on_one_line_and_can_be_rewritten_in_one_pass() -> None:
    # Token rules run only on their keywords' lines, and dense lines are rewritten with re.split around the
    # secret group: a rule that could span lines, or with its secret inside an alternative, breaks both.
    for rule in load_token_rules():
        assert not re.search(r"\\[sn]|\[\^|(?<!\\)\.[*+?{]", rule.pattern.pattern), rule.pattern.pattern
        assert rule.split_form.pattern.groups >= 1


def test_a_long_putty_key_at_the_end_of_a_chunk_is_redacted_to_its_last_line() -> None:
    # Rules run on the chunks holding their keywords, widened by how far their match can reach: a PuTTY key's
    # private lines (up to 256) run far past its "Private-Lines:" keyword.
    lines = [f"Zm9vYmFy{i:04d}" * 5 for i in range(200)]
    text = "x" * (16 * 1024 - 40) + "\nPrivate-Lines: 200\n" + "\n".join(lines) + "\nPrivate-MAC: ab12"
    scrubbed, report = scrub(text)
    assert report.by_type == {"private_key": 1}
    assert not any(line in scrubbed for line in lines)


# The same secrets, once and repeated hundreds of times on one line (each rewrite form: fixed text around the
# value, varying text around it, whole matches that repeat, values checked one by one), and a refused look-alike
# next to each: the dense rewrite must redact and count exactly what scrubbing each copy alone does.
_DENSE_UNITS = [
    "app:s3cret@tcp(db:3306)/x ", "app:${DB_PASSWORD}@tcp(db)/x ", "u:PASSWORD@unix(/s)/d ", "u:****@tcp(h)/d ",
    "redis://:Hx92kLq0@cache:6379/0 ", "https://u:xxxx@h/ ", "postgres://a:{{ pw }}@h/d ",
    "sshpass -p hunter22 ssh h\n", "sshpass -p $PW ssh h\n", "curl -u admin:Secr3t99 https://h\n",
    "curl -u a:settings.DB_PASSWORD https://h\n", "docker run -u 1000:1000 app; curl -u 1000:1000 h\n",
    "mysql -pS3cret! shop\n", "redis-cli -a r3dis!pw ping\n", "x --password hunter22 y\n",
    'Authorization: Bearer 3q9Zx7Lm2Kp8Vw4Rt6Yu1Io5\n', '"auth": "dXNlcjpwYXNzd29yZA=="\n',
    "ghp_R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3s0n1y ", "sk-T7qXk2Lm9Pw4Rz8Nc3Vb6Hd1Jf5Gs0Ya2Ue7Io4Kl9Mn3Bv8Cx ",
    "db.example.com:5432:shop:app:s3cr3t-pw\n",
]


@pytest.mark.parametrize("unit", _DENSE_UNITS)
def test_a_dense_line_is_redacted_and_counted_as_each_copy_alone(unit: str) -> None:
    alone, report = scrub(unit)
    dense, dense_report = scrub(unit * 400)
    assert dense == alone * 400
    assert dense_report.by_type == {kind: 400 * n for kind, n in report.by_type.items()}


def test_a_dense_line_of_distinct_secrets_is_fully_redacted() -> None:
    # every value differs (a dump of credentials): no rewrite may rely on the matches repeating
    line = "".join(f"sshpass -p pw{i:05d}x ssh h; " for i in range(600))
    scrubbed, report = scrub(line)
    assert scrubbed == "sshpass -p [REDACTED_PASSWORD] ssh h; " * 600
    assert report.by_type == {"password": 600}


@pytest.mark.parametrize("command", ["sshpass -p {} ssh h; ", "curl -u a:{} h\n", "mysql -p{} shop\n"])
def test_distinct_values_checked_together_get_the_verdict_each_gets_alone(command: str) -> None:
    # Many distinct values are checked in one regex pass over all of them (_verdicts): references, templates,
    # numbers and short values among them must stay, as they do when each line is scrubbed alone.
    look_alikes = ["$PW", "settings.db.pw", "****", "ab", "-x", "1234", "PASSWORD", "a(b)c", "a...b", "none",
                   "{{pw}}", "<pw>", "%s", "x.y)"]
    units = [command.format(look_alikes[i % len(look_alikes)] if i % 3 == 0 else f"Pw{i}x!") for i in range(300)]
    scrubbed, report = scrub("".join(units))
    alone = [scrub(unit) for unit in units]
    assert scrubbed == "".join(text for text, _ in alone)
    assert report.total == sum(r.total for _, r in alone) >= 200  # the generated passwords (and "1234" after -p)


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=12), max_size=40))
def test_a_check_written_as_a_regex_agrees_with_the_value_checks_and_with_itself_in_bulk(values: list[str]) -> None:
    values += ["$PW", "settings.DB_PASSWORD", "x.y)", "xxxx", "****", "true", "TOKEN", "a...b", "-p", "1000", "hunter22"]
    for value in values:
        assert scrub_module._flag_password((value,)) == (_plain_value(value) and not value.startswith("-")), value
        assert scrub_module._user_password((value,)) == (_plain_value(value) and not value.isdecimal()), value
    for check in (scrub_module._flag_password, scrub_module._user_password):
        alone = {value for value in values if not check((value,))}
        assert set(check.lines.findall("\n" + "\n".join(values))) == alone
        assert set(check.refused("\n" + "\n".join(values))) == alone  # the same check, part by part


def test_a_whole_match_parsed_on_its_own_has_the_groups_it_has_in_its_text() -> None:
    # Text dense with repeating matches is rewritten by parsing each distinct whole match again out of its text
    # (_rewrite_wholes): only rules whose matches read nothing around them may be, and for those the parse must
    # find the same value.
    texts = [p.text for p in POSITIVES] + [unit * 3 for unit in _DENSE_UNITS]
    checked = 0
    for rule in _RULES:
        if rule.lowered or rule.where == "guard":
            continue
        form = rule.split_form
        if form.whole is None:
            continue
        for text in texts:
            for match in rule.pattern.finditer(text):
                again = form.reparse.fullmatch(match.group())
                assert again is not None and again.groupdict() == match.groupdict(), (rule.pattern.pattern, text)
                checked += 1
    assert checked >= 20


# ------------------------------------------------------------------------ a dump of distinct credentials
# A window with many assignments is rewritten in one pass (_rewrite_assignments: one split of the original
# text, each distinct head parsed once, each value check one regex pass over all values): it must redact and
# count exactly what the assignment rule does match by match, for every name strength, form and look-alike.

_NAMES = ["password", "PASSWORD", "DB_PASS", "apiKey", "signingKey", "SIGNING_KEY", "KEY_COUNT", "cache_key",
          "secret_key_base", "max_tokens", "client_secret", "private_key_id", "credentials", "keyboard", "api_key",
          '"password"', "'token'", "passwordHash", "mistral\u212aey", "\u0130_token"]
_SEPARATORS = ["=", ": ", " = ", ":", '="', ": '", '= "', "==", " : ", "= '"]
_LOOK_ALIKES = ["${SECRET}", "<redacted>", "", "3", "user:123:profile", "hunter22", "Secr3t99!", "a(b)", "x.y.z",
                "settings.DB_PASSWORD", "****", "xxxx", "XXXXXX", "true", "None", "PASSWORD", "1.2.3", "https://h/x",
                "/etc/gcp/sa.json", "orders/2024/summary", "[REDACTED_PASSWORD]", "a b", "{{pw}}", "%(pw)s",
                "ab...", "päss1234", "ab\\\"cd", "q1w2e3r4t5y6u7i8o9", "AbCdEfGhIjKlMnOpQrSt", "sk-...", "abc…"]
_VALUE = st.one_of(st.sampled_from(_LOOK_ALIKES), st.text(alphabet="abXY09_-.:/$!@ (){}[]*'\"\\Kü", max_size=24))
_ENDINGS = ["\n", '"\n', "'\n", " x\n", ",\n", "; token=abc123\n"]


def _per_match(text: str) -> tuple[str, ScrubReport]:
    # the same scrub with every window matched one match at a time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scrub_module, "_DENSE", 10**9)
        return scrub(text)


@settings(max_examples=30, deadline=None)  # each example scrubs ~300 lines twice
@given(st.lists(st.tuples(st.sampled_from(_NAMES), st.sampled_from(_SEPARATORS), _VALUE, st.sampled_from(_ENDINGS)),
                min_size=1, max_size=30),
       st.sampled_from(["", f"GITHUB_TOKEN={GITHUB_CLASSIC}\n", "password=\u212a3y5ecret\n"]))
def test_a_dump_of_assignments_rewritten_in_one_pass_agrees_with_matching_one_at_a_time(
        lines: list[tuple[str, str, str, str]], extra: str) -> None:
    unit = "".join(name + separator + value + ending for name, separator, value, ending in lines)
    # over _DENSE matches in one window, with an earlier redaction (the token) or a case-folded letter inside
    text = unit * (300 // len(lines) + 1) + extra + unit
    dense, report = scrub(text)
    alone, alone_report = _per_match(text)
    assert dense == alone
    assert report.by_type == alone_report.by_type


def test_a_dump_of_distinct_passwords_takes_the_one_pass_rewrite() -> None:
    calls = []
    rewrite = scrub_module._rewrite_assignments

    def spy(window: str, counts: dict[str, int]) -> str | None:
        calls.append(len(window))
        return rewrite(window, counts)

    lines = [f"password=Pw{i:05d}x!\n" for i in range(1000)] + ["password=${SECRET}\n", "KEY_COUNT=3\n"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scrub_module, "_rewrite_assignments", spy)
        scrubbed, report = scrub("".join(lines))
    assert calls  # the dump was rewritten in one pass, not match by match
    assert scrubbed == "password=[REDACTED_PASSWORD]\n" * 1000 + "password=${SECRET}\nKEY_COUNT=3\n"
    assert report.by_type == {"password": 1000}


@given(st.lists(st.text(alphabet="abcxyzXPSTA019_-.:/$!@%*<>{}()[]~+,…\u00e9 \t", max_size=30), max_size=40))
def test_each_value_check_in_bulk_agrees_with_the_check_of_one_value(values: list[str]) -> None:
    values += ["${SECRET}", "<redacted>", "", "3", "user:123:profile", "xxxx", "XXXX", "****", "*", "true",
               "settings.DB_PASSWORD", "a.b)", "PASSWORD", "Secr3t99", "q1w2e3r4t5y6u7i8o9", "AbCdEfGhIjKlMnOpQrSt",
               "[REDACTED_X]", "1.2.3", "https://h/x", "/etc/a.json", "orders/2024/summary", "a(b", "ab...", "{{x}}"]
    value_char = re.compile(r"""[^\s"'`,;&]""")
    for check, accept in scrub_module._VALUE_CHECKS.items():
        # the values each form can hand over: an unquoted value is four value characters or more
        valid = [v for v in values if check in ("quoted", "suffix", "inner")
                 or (len(v) >= 4 and all(value_char.fullmatch(c) for c in v))]
        expected = {v for v in valid if scrub_module.PLACEHOLDER_PREFIX in v or not accept(v)}
        assert scrub_module._refused(check, valid) == expected, check


def test_a_token_on_a_long_line_is_found_as_on_a_short_one() -> None:
    # On a long line a token rule searches only the runs without blanks around its keywords
    filler = "word, sk- xox :aa AKIA ghp_ " * 400
    tokens = [GITHUB_CLASSIC, SLACK, AWS_ID, "123456789:AA" + "Bc1" * 11, OPENAI_LEGACY]
    line = "".join(f"{filler}({token}) " for token in tokens) + filler
    assert len(line) > scrub_module._LONG_LINE
    scrubbed, report = scrub(line)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scrub_module, "_LONG_LINE", 10**9)
        assert scrub(line) == (scrubbed, report)
    assert not any(token in scrubbed for token in tokens)
