"""A corpus for measuring the scrubber: secrets in the formats public rule sets document, and look-alikes.

Each positive is a secret format that a maintained public secret-detection rule set documents (the rule id in
gitleaks, or the vendor's own token documentation where no rule set covers the syntax), shown the way it turns up
in a pasted file or command. The values are made up here from each documented shape (prefix, alphabet, length)
with a seeded generator: they look real and were never issued. The corpus is written from those documented
formats, not from conclave's own patterns, so it measures recall rather than restating the rules. Each
section was written before the rules for its formats; the last section of positives was written after them, to
see how the rules do on formats they were not written for (9 of its 20 were caught then; rules for the prefixed
ones came after).

Each negative is text that resembles a secret and is not one: UUIDs, commit SHAs, digests, data URIs, public
keys and certificates, counts and limits named like secrets, template references, cache keys, ports and flags.

Used by ``tests/test_scrub.py`` (recall and false-positive goals) and ``bench/scrub.py`` (the figures).
"""

from __future__ import annotations

import base64
import random
import string
from dataclasses import dataclass

_ALNUM = string.ascii_letters + string.digits
_HEX = "0123456789abcdef"
_B64URL = _ALNUM + "_-"
_B64 = _ALNUM + "+/"


def _r(alphabet: str, n: int, seed: str) -> str:
    """``n`` characters of ``alphabet``, the same every run for one ``seed``."""
    rng = random.Random(seed)
    while True:
        value = "".join(rng.choice(alphabet) for _ in range(n))
        # a generated secret has a digit and, when letters of both cases are allowed, both cases
        if (any(c.isdigit() for c in value) or not any(c.isdigit() for c in alphabet)) and (
            not (set(string.ascii_lowercase) & set(alphabet) and set(string.ascii_uppercase) & set(alphabet))
            or (any(c.islower() for c in value) and any(c.isupper() for c in value))
        ):
            return value


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _pem_body(seed: str, lines: int = 6) -> str:
    return "\n".join(_r(_B64, 64, f"{seed}{i}") for i in range(lines))


@dataclass(frozen=True)
class Positive:
    name: str  # the format
    source: str  # where the format is documented (gitleaks rule id, or vendor documentation)
    text: str  # the secret in a typical setting
    secrets: tuple[str, ...]  # what must not survive scrubbing


@dataclass(frozen=True)
class Negative:
    name: str
    text: str  # must come back unchanged


def _p(name: str, source: str, text: str, *secrets: str) -> Positive:
    return Positive(name, source, text, secrets)


_RSA = _pem_body("rsa", 8)
_OPENSSH = _pem_body("openssh", 5)
_EC = _pem_body("ec", 3)
_PGP = _pem_body("pgp", 6)
_PUTTY = _pem_body("putty", 4)
_JSON_PEM = "\\n".join(_r(_B64, 64, f"sa{i}") for i in range(5))

POSITIVES: tuple[Positive, ...] = (
    # --- AI providers
    _p("OpenAI project key", "gitleaks:openai-api-key",
       "export OPENAI_API_KEY=sk-proj-{}".format(v := _r(_B64URL, 120, "oa1")), v),
    _p("OpenAI legacy key", "gitleaks:openai-api-key",
       "client = OpenAI(api_key='sk-{}')".format(v := _r(_ALNUM, 48, "oa2")), v),
    _p("OpenAI service-account key", "gitleaks:openai-api-key",
       "key: sk-svcacct-{}".format(v := _r(_B64URL, 100, "oa3")), v),
    _p("Anthropic API key", "gitleaks:anthropic-api-key",
       "ANTHROPIC_API_KEY=sk-ant-api03-{}AA".format(v := _r(_B64URL, 93, "an1")), v),
    _p("Anthropic admin key", "gitleaks:anthropic-admin-api-key",
       "admin key sk-ant-admin01-{}AA".format(v := _r(_B64URL, 93, "an2")), v),
    _p("Google API key", "gitleaks:gcp-api-key",
       "https://generativelanguage.googleapis.com/v1beta/models?key=AIza{}".format(v := _r(_B64URL, 35, "g1")), v),
    _p("xAI API key", "xAI documentation (xai- prefix)",
       'XAI_API_KEY="xai-{}"'.format(v := _r(_ALNUM, 80, "x1")), v),
    _p("Groq API key", "Groq documentation (gsk_ prefix)",
       "GROQ_KEY=gsk_{}".format(v := _r(_ALNUM, 52, "gq")), v),
    _p("Hugging Face user token", "gitleaks:huggingface-access-token",
       "huggingface-cli login --token hf_{}".format(v := _r(string.ascii_letters, 34, "hf1")), v),
    _p("Hugging Face organization token", "gitleaks:huggingface-organization-api-token",
       "HF_ORG = 'api_org_{}'".format(v := _r(string.ascii_letters, 34, "hf2")), v),
    _p("Perplexity API key", "gitleaks:perplexity-api-key",
       "pplx-{}".format(v := _r(_ALNUM, 48, "pp")), v),
    # --- source hosting and CI
    _p("GitHub personal access token", "gitleaks:github-pat",
       "git clone https://ghp_{}@github.com/acme/billing.git".format(v := _r(_ALNUM, 36, "gh1")), v),
    _p("GitHub fine-grained token", "gitleaks:github-fine-grained-pat",
       "GH_TOKEN=github_pat_{}".format(v := _r(_ALNUM + "_", 82, "gh2")), v),
    _p("GitHub OAuth token", "gitleaks:github-oauth", "oauth: gho_{}".format(v := _r(_ALNUM, 36, "gh3")), v),
    _p("GitHub app token", "gitleaks:github-app-token", "ghs_{}".format(v := _r(_ALNUM, 36, "gh4")), v),
    _p("GitLab personal access token", "gitleaks:gitlab-pat",
       "--build-arg 'GO_REPO_TOKEN=glpat-{}'".format(v := _r(_B64URL, 20, "gl1")), v),
    _p("GitLab runner authentication token", "gitleaks:gitlab-runner-authentication-token",
       'token = "glrt-{}"'.format(v := _r(_B64URL, 20, "gl2")), v),
    _p("GitLab runner registration token", "gitleaks:gitlab-rrt",
       'gitlab-runner register --registration-token "GR1348941{}"'.format(v := _r(_B64URL, 20, "gl3")), v),
    _p("GitLab deploy token", "gitleaks:gitlab-deploy-token", "gldt-{}".format(v := _r(_B64URL, 20, "gl4")), v),
    _p("GitLab pipeline trigger token", "gitleaks:gitlab-ptt",
       "curl -X POST -F token=glptt-{} -F ref=main".format(v := _r(_HEX, 40, "gl5")), v),
    _p("npm access token", "gitleaks:npm-access-token",
       "//registry.npmjs.org/:_authToken=npm_{}".format(v := _r(_ALNUM, 36, "npm")), v),
    _p("PyPI upload token", "gitleaks:pypi-upload-token",
       "password = pypi-AgEIcHlwaS5vcmc{}".format(v := _r(_B64URL, 70, "pypi")), v),
    _p("Docker Hub access token", "Docker documentation (dckr_pat_ prefix)",
       "echo dckr_pat_{} | docker login -u acme --password-stdin".format(v := _r(_B64URL, 27, "dh")), v),
    _p("Atlassian API token", "gitleaks:atlassian-api-token",
       "JIRA_TOKEN ATATT3x{}".format(v := _r(_B64URL, 180, "atl")), v),
    _p("Postman API key", "gitleaks:postman-api-token",
       "PMAK-{}-{}".format(v := _r(_HEX, 24, "pm1"), w := _r(_HEX, 34, "pm2")), v, w),
    _p("Linear API key", "gitleaks:linear-api-key", "lin_api_{}".format(v := _r(_ALNUM, 40, "lin")), v),
    # --- chat and messaging
    _p("Slack bot token", "gitleaks:slack-bot-token",
       "slack:\n  bot_token: xoxb-{}-{}-{}\n".format(_r(string.digits, 10, "s1"), _r(string.digits, 13, "s2"),
                                                     v := _r(_ALNUM, 24, "s3")), v),
    _p("Slack user token", "gitleaks:slack-user-token",
       "xoxp-{}-{}-{}-{}".format(_r(string.digits, 11, "s4"), _r(string.digits, 11, "s5"),
                                  _r(string.digits, 12, "s6"), v := _r(_HEX, 32, "s7")), v),
    _p("Slack app-level token", "gitleaks:slack-app-token",
       "SLACK_APP=xapp-1-A{}-{}-{}".format(_r(string.digits, 10, "s8"), _r(string.digits, 13, "s9"),
                                            v := _r(_HEX, 64, "s10")), v),
    _p("Slack incoming webhook URL", "gitleaks:slack-webhook-url",
       "curl -X POST https://hooks.slack.com/services/T{}/B{}/{} -d @msg.json".format(
           v := _r(string.ascii_uppercase + string.digits, 10, "sw1"), w := _r(string.ascii_uppercase + string.digits,
                                                                                 10, "sw2"),
           x := _r(_ALNUM, 24, "sw3")), x),
    _p("Discord webhook URL", "Discord documentation (webhook URL)",
       "https://discord.com/api/webhooks/{}/{}".format(_r(string.digits, 18, "dw1"), v := _r(_B64URL, 68, "dw2")), v),
    _p("Telegram bot token", "gitleaks:telegram-bot-api-token",
       "TELEGRAM = {}:AA{}".format(_r(string.digits, 10, "tg1"), v := _r(_B64URL, 33, "tg2")), v),
    # --- email and SMS
    _p("SendGrid API key", "gitleaks:sendgrid-api-token",
       "sg = SendGridAPIClient('SG.{}.{}')".format(v := _r(_B64URL, 22, "sg1"), w := _r(_B64URL, 43, "sg2")), v, w),
    _p("Twilio API key", "gitleaks:twilio-api-key",
       "client = Client('SK{}', api_secret)".format(v := _r(_HEX, 32, "tw")), v),
    _p("Mailgun private key", "gitleaks:mailgun-private-api-token",
       "auth=('api', 'key-{}')".format(v := _r(_HEX, 32, "mg")), v),
    _p("Mailchimp API key", "gitleaks:mailchimp-api-key",
       "MC = '{}-us14'".format(v := _r(_HEX, 32, "mc")), v),
    # --- payments and commerce
    _p("Stripe secret key", "gitleaks:stripe-access-token",
       "stripe.api_key = 'sk_live_{}'".format(v := _r(_ALNUM, 24, "st1")), v),
    _p("Stripe restricted key", "gitleaks:stripe-access-token", "rk_live_{}".format(v := _r(_ALNUM, 24, "st2")), v),
    _p("Square access token", "gitleaks:square-access-token", "sq0atp-{}".format(v := _r(_B64URL, 22, "sq")), v),
    _p("Shopify access token", "gitleaks:shopify-access-token", "shpat_{}".format(v := _r(_HEX, 32, "sh")), v),
    # --- clouds
    _p("AWS access key id", "gitleaks:aws-access-token",
       "aws_access_key_id = AKIA{}".format(v := _r(string.ascii_uppercase + "234567", 16, "aws1")), v),
    _p("AWS secret access key", "AWS documentation (credentials file)",
       "aws_secret_access_key = {}".format(v := _r(_B64, 40, "aws2")), v),
    _p("Azure AD client secret", "gitleaks:azure-ad-client-secret",
       'client_credential="{}8Q~{}"'.format(v := _r(_ALNUM, 3, "az1"), w := _r(_B64URL + "~.", 34, "az2")), w),
    _p("Azure storage connection string", "Azure documentation (connection string)",
       "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={}==;EndpointSuffix=core.windows.net".format(
           v := _r(_B64, 86, "az3")), v),
    _p("DigitalOcean personal access token", "gitleaks:digitalocean-pat",
       "doctl auth init -t dop_v1_{}".format(v := _r(_HEX, 64, "do1")), v),
    _p("DigitalOcean OAuth token", "gitleaks:digitalocean-access-token",
       "doo_v1_{}".format(v := _r(_HEX, 64, "do2")), v),
    _p("Vault service token", "gitleaks:vault-service-token",
       "export VAULT_TOKEN=hvs.{}".format(v := _r(_B64URL, 95, "v1")), v),
    _p("Vault legacy token", "gitleaks:vault-service-token",
       "vault login s.{}".format(v := _r(_ALNUM, 24, "v2")), v),
    _p("Vault batch token", "gitleaks:vault-batch-token", "hvb.{}".format(v := _r(_B64URL, 140, "v3")), v),
    _p("Terraform Cloud token", "gitleaks:hashicorp-tf-api-token",
       'token = "{}.atlasv1.{}"'.format(_r(_ALNUM, 14, "tf1"), v := _r(_B64URL, 67, "tf2")), v),
    _p("Doppler token", "gitleaks:doppler-api-token", "dp.pt.{}".format(v := _r(_ALNUM, 43, "dp")), v),
    _p("Pulumi token", "gitleaks:pulumi-api-token", "pul-{}".format(v := _r(_HEX, 40, "pu")), v),
    _p("Databricks token", "gitleaks:databricks-api-token", "dapi{}".format(v := _r(_HEX, 32, "db")), v),
    _p("Alibaba access key id", "gitleaks:alibaba-access-key-id", "LTAI{}".format(v := _r(_ALNUM, 20, "ali")), v),
    _p("Heroku API key v2", "gitleaks:heroku-api-key-v2", "HRKU-AA{}".format(v := _r(_B64URL, 58, "her")), v),
    _p("Fly.io access token", "gitleaks:flyio-access-token", "fo1_{}".format(v := _r(_B64URL, 43, "fly")), v),
    _p("PlanetScale password", "gitleaks:planetscale-password",
       "pscale_pw_{}".format(v := _r(_B64URL, 43, "ps")), v),
    _p("Grafana service account token", "gitleaks:grafana-service-account-token",
       "glsa_{}_{}".format(v := _r(_ALNUM, 32, "gr1"), _r(_HEX, 8, "gr2")), v),
    _p("New Relic user API key", "gitleaks:new-relic-user-api-key",
       "NRAK-{}".format(v := _r(string.ascii_uppercase + string.digits, 27, "nr")), v),
    _p("Sentry user token", "gitleaks:sentry-user-token", "sntryu_{}".format(v := _r(_HEX, 64, "se")), v),
    _p("Google OAuth client secret", "Google documentation (GOCSPX- prefix)",
       '"client_secret": "GOCSPX-{}"'.format(v := _r(_B64URL, 28, "gcs")), v),
    _p("age secret key", "gitleaks:age-secret-key",
       "AGE-SECRET-KEY-1{}".format(v := _r("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58, "age")), v),
    _p("JSON Web Token", "gitleaks:jwt",
       "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJ{}.{}".format(v := _r(_B64URL, 40, "jwt1"),
                                                                   w := _r(_B64URL, 43, "jwt2")), v, w),
    # --- private keys
    _p("RSA private key", "gitleaks:private-key",
       f"deploy key:\n-----BEGIN RSA PRIVATE KEY-----\n{_RSA}\n-----END RSA PRIVATE KEY-----\n", _RSA[:64]),
    _p("OpenSSH private key", "gitleaks:private-key",
       f"-----BEGIN OPENSSH PRIVATE KEY-----\n{_OPENSSH}\n-----END OPENSSH PRIVATE KEY-----", _OPENSSH[-64:]),
    _p("EC private key, pasted without its END line", "gitleaks:private-key",
       f"-----BEGIN EC PRIVATE KEY-----\n{_EC}\n", _EC[-64:]),
    _p("PGP private key block", "gitleaks:private-key",
       f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{_PGP}\n-----END PGP PRIVATE KEY BLOCK-----", _PGP[:64]),
    _p("Service account JSON private key", "Google documentation (service account key file)",
       '"private_key": "-----BEGIN PRIVATE KEY-----\\n' + _JSON_PEM + '\\n-----END PRIVATE KEY-----\\n",',
       _JSON_PEM[:64]),
    _p("PuTTY private key", "PuTTY documentation (PPK file format)",
       f"PuTTY-User-Key-File-3: ssh-rsa\nEncryption: none\nComment: deploy\nPublic-Lines: 1\n{_r(_B64, 64, 'pub')}\n"
       f"Private-Lines: 4\n{_PUTTY}\nPrivate-MAC: {_r(_HEX, 64, 'mac')}\n", _PUTTY[:64], _PUTTY[-64:]),
    # --- credentials by syntax
    _p("HTTP Basic authorization header", "RFC 7617 (Basic scheme)",
       "curl -H 'Authorization: Basic {}' https://api.example.com".format(v := _b64("deploy:Wq8-pR2zLx")), v),
    _p("HTTP Bearer header with an opaque token", "RFC 6750 (Bearer scheme)",
       "Authorization: Bearer {}".format(v := _r(_ALNUM, 32, "br")), v),
    _p(".netrc password", "GNU inetutils documentation (.netrc)",
       "machine api.example.com\n  login deploy\n  password {}\n".format(v := _r(_ALNUM, 16, "netrc")), v),
    _p(".netrc password on one line", "GNU inetutils documentation (.netrc)",
       "machine git.example.com login ci password {}".format(v := _r(_ALNUM, 20, "netrc2")), v),
    _p("Docker config.json auths", "Docker documentation (config.json)",
       '{{"auths": {{"registry.example.com": {{"auth": "{}"}}}}}}'.format(v := _b64("ci:" + _r(_ALNUM, 16, "dk"))),
       v),
    _p("curl -u user:password", "curl documentation (-u, --user)",
       "curl -u admin:{} https://ci.example.com/api/json".format(v := _r(_ALNUM, 14, "curl")), v),
    _p("mysql -p password", "MySQL documentation (--password, -p)",
       "mysql -h db.internal -u root -p{} shop".format(v := _r(_ALNUM, 12, "mysql")), v),
    _p("sshpass -p password", "sshpass manual (-p)",
       "sshpass -p '{}' ssh deploy@10.0.0.5".format(v := _r(_ALNUM, 12, "sshpass")), v),
    _p("redis-cli -a password", "Redis documentation (redis-cli -a)",
       "redis-cli -h cache -a {} ping".format(v := _r(_ALNUM, 16, "rcli")), v),
    _p("Redis URL with a password and no user", "Redis documentation (redis:// URI)",
       "REDIS_URL=redis://:{}@cache.internal:6379/0".format(v := _r(_ALNUM, 16, "redis")), v),
    _p("PostgreSQL URL", "PostgreSQL documentation (connection URI)",
       "DATABASE_URL=postgres://billing:{}@db.internal:5432/billing".format(v := _r(_ALNUM, 14, "pg")), v),
    _p("MongoDB SRV URL", "MongoDB documentation (connection string)",
       "mongodb+srv://app:{}@cluster0.example.mongodb.net/test".format(v := _r(_ALNUM, 14, "mongo")), v),
    _p("Go MySQL DSN", "go-sql-driver/mysql documentation (DSN)",
       'db, _ := sql.Open("mysql", "app:{}@tcp(127.0.0.1:3306)/shop")'.format(v := _r(_ALNUM, 12, "godsn")), v),
    _p(".pgpass line", "PostgreSQL documentation (password file)",
       "db.internal:5432:billing:app:{}".format(v := _r(_ALNUM, 14, "pgpass")), v),
    _p("JDBC URL password parameter", "PostgreSQL JDBC documentation",
       "jdbc:postgresql://db/app?user=app&password={}".format(v := _r(_ALNUM, 12, "jdbc")), v),
    _p("Mistral key by its variable", "Mistral documentation (MISTRAL_API_KEY)",
       "MISTRAL_API_KEY={}".format(v := _r(_ALNUM, 32, "mis")), v),
    _p(".env database password", "dotenv convention", "DB_PASSWORD={}".format(v := _r(_ALNUM, 12, "env")), v),
    _p("YAML password", "gitleaks:generic-api-key", 'smtp:\n  password: "{}"\n'.format(v := _r(_ALNUM, 12, "yml")),
       v),
    _p("Django SECRET_KEY", "Django documentation (SECRET_KEY)",
       "SECRET_KEY = 'django-insecure-{}'".format(v := _r(_ALNUM + "#@!", 40, "dj")), v),
    _p("Rails secret_key_base", "Rails documentation (secret_key_base)",
       "production:\n  secret_key_base: {}\n".format(v := _r(_HEX, 128, "rails")), v),
    _p("Kubeconfig user token", "Kubernetes documentation (kubeconfig)",
       "users:\n- name: ci\n  user:\n    token: {}\n".format(v := _r(_ALNUM, 40, "kube")), v),
    _p("docker login --password", "Docker documentation (docker login)",
       "docker login --username ci --password {} registry.example.com".format(v := _r(_ALNUM, 16, "dlogin")), v),
    _p("wget --password", "GNU Wget manual (--password)",
       "wget --user=ci --password={} https://files.example.com/x".format(v := _r(_ALNUM, 14, "wget")), v),
    # --- model hubs and AI services (shapes from each vendor's documentation, values made up here)
    _p("Hugging Face token with digits", "Hugging Face documentation (User access tokens, hf_ prefix)",
       'login(token="hf_{}")'.format(v := _r(_ALNUM, 34, "hf3")), v),
    _p("Hugging Face token in a git remote", "Hugging Face documentation (git over HTTPS)",
       "git remote set-url origin https://user:hf_{}@huggingface.co/acme/model".format(
           v := _r(string.ascii_letters, 34, "hf4")), v),
    _p("Replicate API token", "Replicate documentation (r8_ prefix)",
       "Using replicate token r8_{} for the nightly run".format(v := _r(_ALNUM, 37, "rep1")), v),
    _p("Replicate token in a header", "Replicate documentation (HTTP API)",
       'curl -s -H "Authorization: Token r8_{}" https://api.replicate.com/v1/predictions'.format(
           v := _r(_ALNUM, 37, "rep2")), v),
    _p("Together AI key", "Together AI documentation (tgp_v1_ prefix)",
       "together = Together(api_key='tgp_v1_{}')".format(v := _r(_B64URL, 43, "tog")), v),
    _p("Fireworks AI key", "Fireworks documentation (fw_ prefix)",
       "fireworks key fw_{}".format(v := _r(_ALNUM, 24, "fw")), v),
    _p("ElevenLabs API key", "ElevenLabs documentation (xi-api-key header)",
       'curl -H "xi-api-key: sk_{}" https://api.elevenlabs.io/v1/voices'.format(v := _r(_HEX, 48, "el")), v),
    _p("Langfuse secret key", "Langfuse documentation (sk-lf- prefix)",
       "Langfuse(secret_key=os.environ['LF'], public_key='pk-lf-1') # old: sk-lf-{}".format(
           v := "-".join(_r(_HEX, n, f"lf{n}") for n in (8, 4, 4, 4, 12))), v),
    _p("Voyage AI key", "Voyage AI documentation (pa- prefix)",
       "vo = voyageai.Client('pa-{}')".format(v := _r(_B64URL, 43, "voy")), v),
    _p("DeepSeek key", "DeepSeek documentation (sk- prefix, OpenAI-compatible)",
       'client = OpenAI(base_url="https://api.deepseek.com", api_key="sk-{}")'.format(v := _r(_HEX, 32, "ds")), v),
    _p("OpenAI admin key", "OpenAI documentation (admin keys)",
       "ADMIN=sk-admin-{}".format(v := _r(_B64URL, 58, "oaadm")), v),
    _p("Anyscale key", "Anyscale documentation (esecret_ prefix)",
       "anyscale key esecret_{}".format(v := _r(_ALNUM, 26, "any")), v),
    _p("AWS Bedrock long-term API key", "AWS documentation (Bedrock API keys, ABSK prefix)",
       "bedrock key ABSK{}".format(v := _b64("BedrockAPIKey-" + _r(_ALNUM, 8, "absk1") + "-at-123456789012:"
                                           + _r(_B64, 40, "absk2"))), v),
    # --- chat bots
    _p("Telegram bot token, Bot API shape", "Telegram Bot API documentation (token)",
       "bot = telebot.TeleBot('{}:AA{}')".format(_r(string.digits, 10, "tg3"), v := _r(_B64URL, 33, "tg4")), v),
    _p("Telegram bot token in a Bot API URL", "Telegram Bot API documentation (https://api.telegram.org/bot<token>/)",
       "curl https://api.telegram.org/bot{}:AA{}/getMe".format(_r(string.digits, 9, "tg5"),
                                                                v := _r(_B64URL, 33, "tg6")), v),
    _p("Telegram bot token, BotFather shape", "Telegram documentation (BotFather: 123456:ABC-DEF...)",
       "token from BotFather: {}:{}".format(_r(string.digits, 10, "tg7"), v := "AAF" + _r(_B64URL, 32, "tg8")), v),
    _p("Discord bot token", "Discord developer documentation (bot token: id.timestamp.hmac)",
       'client.run("{}.{}.{}")'.format(_b64(_r(string.digits, 19, "dc1")).rstrip("="), _r(_B64URL, 6, "dc2"),
                                       v := _r(_B64URL, 38, "dc3")), v),
    _p("Discord bot authorization header", "Discord developer documentation (Authorization: Bot)",
       "Authorization: Bot {}.{}.{}".format(_b64(_r(string.digits, 18, "dc4")).rstrip("="), _r(_B64URL, 6, "dc5"),
                                            v := _r(_B64URL, 27, "dc6")), v),
    # --- file sharing
    _p("Dropbox short-lived access token", "Dropbox documentation (sl. prefix)",
       'dbx = dropbox.Dropbox("sl.{}")'.format(v := _r(_B64URL, 138, "dbx1")), v),
    _p("Dropbox short-lived access token, sl.u. shape", "Dropbox documentation (sl.u. prefix)",
       "DROPBOX access: sl.u.{}".format(v := _r(_B64URL, 180, "dbx2")), v),
    # --- error tracking
    _p("Sentry DSN", "Sentry documentation (DSN: https://<key>@o<org>.ingest.sentry.io/<project>)",
       'sentry_sdk.init(dsn="https://{}@o{}.ingest.us.sentry.io/{}")'.format(
           v := _r(_HEX, 32, "sdsn1"), _r(string.digits, 6, "sdsn2"), _r(string.digits, 7, "sdsn3")), v),
    _p("Sentry DSN with its legacy secret", "Sentry documentation (legacy DSN with secret key)",
       "SENTRY = 'https://{}:{}@sentry.example.com/12'".format(v := _r(_HEX, 32, "sdsn4"), w := _r(_HEX, 32, "sdsn5")),
       v, w),
    _p("Sentry organization auth token", "Sentry documentation (sntrys_ prefix)",
       "sentry-cli --auth-token sntrys_{}_{} releases list".format(
           _b64('{"iat":1700000000.0,"url":"https://sentry.io","region_url":"https://us.sentry.io","org":"acme"}')
           .rstrip("="), v := _r(_B64URL, 43, "sntrys")), v),
    _p("Honeycomb ingest key", "Honeycomb documentation (hcaik_ prefix)",
       "x-honeycomb-team: hcaik_{}".format(v := _r(_ALNUM, 58, "hny")), v),
    # --- push notifications
    _p("FCM legacy server key", "Firebase documentation (legacy server key)",
       'curl -H "Authorization: key=AAAA{}:APA91b{}" https://fcm.googleapis.com/fcm/send'.format(
           _r(_B64URL, 7, "fcm1"), v := _r(_B64URL, 134, "fcm2")), v),
    _p("Expo push token", "Expo documentation (ExponentPushToken[...])",
       '{{"to": "ExponentPushToken[{}]", "title": "hi"}}'.format(v := _r(_B64URL, 22, "expo")), v),
    _p("Pusher Channels app secret", "Pusher documentation (new Pusher({appId, key, secret}))",
       'new Pusher({{ appId: "{}", key: "{}", secret: "{}", cluster: "eu" }})'.format(
           _r(string.digits, 7, "pu1"), _r(_HEX, 20, "pu2"), v := _r(_HEX, 20, "pu3")), v),
    _p("Pusher Channels URL", "Pusher documentation (PUSHER_URL)",
       "heroku config:set PUSHER_URL=http://{}:{}@api-eu.pusher.com/apps/{}".format(
           _r(_HEX, 20, "pu4"), v := _r(_HEX, 20, "pu5"), _r(string.digits, 7, "pu6")), v),
    _p("OneSignal REST API key", "OneSignal documentation (os_v2_app_ prefix)",
       "Authorization: Key os_v2_app_{}".format(v := _r(string.ascii_lowercase + "234567", 105, "os")), v),
    # --- file encryption
    _p("age identity file", "age documentation (keys.txt from age-keygen)",
       "# created: 2024-05-01T12:00:00Z\n# public key: age1{}\nAGE-SECRET-KEY-1{}\n".format(
           _r("qpzry9x8gf2tvdw0s3jn54khce6mua7l", 58, "agep"), v := _r("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58, "age2")),
       v),
    # --- hosting, CI and package registries
    _p("Netlify personal access token", "Netlify documentation (nfp_ prefix)",
       "netlify deploy --auth nfp_{}".format(v := _r(_ALNUM, 36, "nfp")), v),
    _p("Render API key", "Render documentation (rnd_ prefix)", "render key rnd_{}".format(v := _r(_ALNUM, 28, "rnd")),
       v),
    _p("Neon API key", "Neon documentation (napi_ prefix)", "neon key napi_{}".format(v := _r(_ALNUM, 64, "neon")), v),
    _p("Supabase secret key", "Supabase documentation (sb_secret_ prefix)",
       "createClient(url, 'sb_secret_{}')".format(v := _r(_B64URL, 31, "sbs")), v),
    _p("Cloudflare origin CA key", "Cloudflare documentation (v1.0- origin CA key)",
       "origin ca key v1.0-{}-{}".format(_r(_HEX, 24, "cfo1"), v := _r(_HEX, 146, "cfo2")), v),
    _p("Tailscale auth key", "Tailscale documentation (tskey-auth- prefix)",
       "tailscale up --auth-key=tskey-auth-{}-{}".format(_r(_ALNUM, 11, "ts1"), v := _r(_ALNUM, 33, "ts2")), v),
    _p("Tailscale API key", "Tailscale documentation (tskey-api- prefix)",
       "tskey-api-{}-{}".format(_r(_ALNUM, 11, "ts3"), v := _r(_ALNUM, 33, "ts4")), v),
    _p("Bitbucket app password", "Atlassian documentation (ATBB prefix)",
       "bitbucket app password ATBB{}".format(v := _r(_ALNUM, 32, "atbb") + _r("0123456789ABCDEF", 8, "atbb2")), v),
    _p("SonarQube user token", "SonarQube documentation (squ_ prefix)",
       "sonar-scanner -Dsonar.token=squ_{}".format(v := _r(_HEX, 40, "sq")), v),
    _p("CircleCI personal token", "CircleCI documentation (CCIPAT_ prefix)",
       "circle token CCIPAT_{}_{}".format(_r(_ALNUM, 22, "cci1"), v := _r(_HEX, 40, "cci2")), v),
    _p("Buildkite API token", "Buildkite documentation (bkua_ prefix)",
       "bk token bkua_{}".format(v := _r(_HEX, 40, "bk")), v),
    _p("RubyGems API key", "RubyGems documentation (rubygems_ prefix)",
       "---\n:rubygems_api_key: rubygems_{}\n".format(v := _r(_HEX, 48, "gem")), v),
    _p("NuGet API key", "NuGet documentation (oy2 prefix)",
       "dotnet nuget push pkg.nupkg -k oy2{} -s https://api.nuget.org/v3/index.json".format(
           v := _r(string.ascii_lowercase + string.digits, 43, "nuget")), v),
    _p("crates.io token", "crates.io documentation (cio prefix)",
       "cargo login cio{}".format(v := _r(_ALNUM, 32, "cio")), v),
    _p("Clojars deploy token", "Clojars documentation (CLOJARS_ prefix)",
       "clojars CLOJARS_{}".format(v := _r(_HEX, 60, "clj")), v),
    _p("Docker Swarm join token", "Docker documentation (SWMTKN-1- prefix)",
       "docker swarm join --token SWMTKN-1-{}-{} 10.0.0.5:2377".format(
           _r(string.ascii_lowercase + string.digits, 50, "swm1"), v := _r(string.ascii_lowercase + string.digits, 25,
                                                                              "swm2")), v),
    _p("Kubernetes bootstrap token", "Kubernetes documentation (kubeadm join --token)",
       "kubeadm join 10.0.0.5:6443 --token {}.{} --discovery-token-ca-cert-hash sha256:{}".format(
           _r(string.ascii_lowercase + string.digits, 6, "kb1"), v := _r(string.ascii_lowercase + string.digits, 16,
                                                                         "kb2"), _r(_HEX, 64, "kb3")), v),
    _p("1Password service account token", "1Password documentation (ops_ prefix)",
       "OP=ops_{}".format(v := _b64('{"signInAddress":"my.1password.com","userAuth":{"method":"SRPg-4096"},'
                                    '"email":"' + _r(string.ascii_lowercase, 12, "op1")
                                    + '@1passwordserviceaccounts.com",'
                                    '"srpX":"' + _r(_HEX, 64, "op2") + '"}').rstrip("=")), v),
    _p("1Password secret key", "1Password documentation (Secret Key, A3- prefix)",
       "My 1Password Secret Key: A3-{}-{}-{}-{}-{}-{}".format(
           *(_r(string.ascii_uppercase + "23456789", n, f"a3{i}") for i, n in enumerate((6, 6, 5, 5, 5, 5)))),
       "-".join(_r(string.ascii_uppercase + "23456789", n, f"a3{i}") for i, n in enumerate((6, 6, 5, 5, 5, 5)))),
    _p("Tencent Cloud SecretId", "Tencent Cloud documentation (AKID prefix)",
       "tccli configure set secretId AKID{}".format(v := _r(_ALNUM, 32, "akid")), v),
    _p("Okta API token in an SSWS header", "Okta documentation (Authorization: SSWS)",
       'curl -H "Authorization: SSWS 00{}" https://acme.okta.com/api/v1/users'.format(v := _r(_B64URL, 40, "okta")),
       v),
    _p("Yandex OAuth token", "Yandex documentation (y0_ prefix)",
       "yc config set token y0_{}".format(v := _r(_B64URL, 55, "y0")), v),
    # --- business and payment services
    _p("Stripe webhook signing secret", "Stripe documentation (whsec_ prefix)",
       "stripe listen prints whsec_{}".format(v := _r(_ALNUM, 32, "whsec")), v),
    _p("Braintree access token", "Braintree documentation (access_token$production$...)",
       "gateway = braintree.BraintreeGateway(access_token='access_token$production${}${}')".format(
           _r(string.ascii_lowercase + string.digits, 16, "bt1"), v := _r(_HEX, 32, "bt2")), v),
    _p("Flutterwave secret key", "Flutterwave documentation (FLWSECK- prefix)",
       "FLWSECK-{}-X".format(v := _r(_HEX, 32, "flw")), v),
    _p("Plaid access token", "Plaid documentation (access-<env>-<uuid>)",
       '{{"access_token": "access-production-{}"}}'.format(
           v := "-".join(_r(_HEX, n, f"pl{n}") for n in (8, 4, 4, 4, 12))), v),
    _p("Asana personal access token", "Asana documentation (PAT: 2/<id>/<id>:<hex>)",
       "asana token 2/{}/{}:{}".format(_r(string.digits, 16, "as1"), _r(string.digits, 16, "as2"),
                                       v := _r(_HEX, 32, "as3")), v),
    _p("Airtable personal access token", "Airtable documentation (pat<id>.<hex>)",
       "airtable pat{}.{}".format(_r(_ALNUM, 14, "at1"), v := _r(_HEX, 64, "at2")), v),
    _p("Notion integration secret (legacy)", "Notion documentation (secret_ prefix)",
       "notion = Client(auth='secret_{}')".format(v := _r(_ALNUM, 43, "notion")), v),
    _p("HubSpot private app token", "HubSpot documentation (pat-na1- prefix)",
       "hubspot pat-na1-{}".format(v := "-".join(_r(_HEX, n, f"hs{n}") for n in (8, 4, 4, 4, 12))), v),
    _p("Typeform personal token", "Typeform documentation (tfp_ prefix)",
       "typeform tfp_{}_{}".format(v := _r(_B64URL, 44, "tfp1"), _r(_ALNUM, 14, "tfp2")), v),
    _p("Contentful management token", "Contentful documentation (CFPAT- prefix)",
       "contentful CFPAT-{}".format(v := _r(_B64URL, 43, "cf")), v),
    _p("Shippo live token", "Shippo documentation (shippo_live_ prefix)",
       "shippo_live_{}".format(v := _r(_HEX, 40, "shippo")), v),
    _p("EasyPost API key", "EasyPost documentation (EZAK prefix)", "EZAK{}".format(v := _r(_ALNUM, 54, "ezak")), v),
    _p("Duffel live token", "Duffel documentation (duffel_live_ prefix)",
       "duffel_live_{}".format(v := _r(_B64URL, 43, "duffel")), v),
    _p("Resend API key", "Resend documentation (re_ prefix)",
       "resend.api_key = 're_{}_{}'".format(_r(_ALNUM, 8, "re1"), v := _r(_ALNUM, 24, "re2")), v),
    _p("Brevo API key", "Brevo documentation (xkeysib- prefix)",
       "brevo xkeysib-{}-{}".format(v := _r(_HEX, 64, "brevo1"), _r(_ALNUM, 16, "brevo2")), v),
    _p("LaunchDarkly SDK key", "LaunchDarkly documentation (sdk- prefix)",
       "ldclient.set_config(Config('sdk-{}'))".format(v := "-".join(_r(_HEX, n, f"ld{n}") for n in (8, 4, 4, 4, 12))),
       v),
    _p("Facebook access token", "Meta documentation (EAA prefix)",
       "graph = GraphAPI('EAAG{}')".format(v := _r(_ALNUM, 180, "fb")), v),
    _p("Laravel APP_KEY", "Laravel documentation (APP_KEY=base64:)",
       "APP_KEY=base64:{}".format(v := _r(_B64, 43, "lara") + "="), v),
    _p("Jupyter server token in a URL", "Jupyter documentation (?token=)",
       "http://127.0.0.1:8888/lab?token={}".format(v := _r(_HEX, 48, "jup")), v),
    # --- added after the rules above were written, to measure them on formats they were not written for
    _p("Weights & Biases API key", "W&B documentation (wandb login <key>)",
       "wandb login {}".format(v := _r(_HEX, 40, "wandb")), v),
    _p("Kaggle API credentials file", "Kaggle documentation (kaggle.json)",
       '{{"username":"ada","key":"{}"}}'.format(v := _r(_HEX, 32, "kaggle")), v),
    _p("Modal token secret", "Modal documentation (modal token set)",
       "modal token set --token-id ak-{} --token-secret as-{}".format(_r(_ALNUM, 22, "mod1"),
                                                                     v := _r(_ALNUM, 22, "mod2")), v),
    _p("Algolia admin API key in a client", "Algolia documentation (admin API key)",
       "client = SearchClient.create('LATENCY', '{}')".format(v := _r(_HEX, 32, "alg")), v),
    _p("Twitch IRC OAuth password", "Twitch documentation (PASS oauth:<token>)",
       "PASS oauth:{}".format(v := _r(string.ascii_lowercase + string.digits, 30, "twitch")), v),
    _p("PostHog personal API key", "PostHog documentation (phx_ prefix)",
       "posthog key phx_{}".format(v := _r(_ALNUM, 43, "phx")), v),
    _p("Paddle API key", "Paddle documentation (pdl_live_apikey_ prefix)",
       "PADDLE pdl_live_apikey_{}_{}".format(_r(string.ascii_lowercase + string.digits, 26, "pdl1"),
                                             v := _r(_ALNUM, 22, "pdl2")), v),
    _p("Segment write key", "Segment documentation (analytics.load)",
       'analytics.load("{}");'.format(v := _r(_ALNUM, 32, "seg")), v),
    _p("Zapier catch hook URL", "Zapier documentation (webhook URL)",
       "POST https://hooks.zapier.com/hooks/catch/{}/{}/".format(_r(string.digits, 7, "zap1"),
                                                               v := _r(string.ascii_lowercase + string.digits, 7,
                                                                       "zap2")), v),
    _p("Prefect API key", "Prefect documentation (pnu_ prefix)",
       "prefect cloud login -k pnu_{}".format(v := _r(_ALNUM, 36, "pnu")), v),
    _p("Scalingo API token", "Scalingo documentation (tk-us- prefix)",
       "scalingo login --api-token tk-us-{}".format(v := _r(_B64URL, 48, "scal")), v),
    _p("Infisical service token", "Infisical documentation (st. prefix)",
       "infisical st.{}.{}.{}".format("-".join(_r(_HEX, n, f"inf{n}") for n in (8, 4, 4, 4, 12)),
                                      _r(_HEX, 32, "inf1"), v := _r(_HEX, 32, "inf2")), v),
    _p("Harness personal access token", "Harness documentation (pat. prefix)",
       "x-api-key pat.{}.{}.{}".format(_r(_B64URL, 22, "har1"), _r(_HEX, 24, "har2"), v := _r(_ALNUM, 20, "har3")),
       v),
    _p("Dynatrace API token", "Dynatrace documentation (dt0c01. prefix)",
       "Api-Token dt0c01.{}.{}".format(_r(string.ascii_uppercase + "234567", 24, "dt1"),
                                       v := _r(string.ascii_uppercase + "234567", 64, "dt2")), v),
    _p("Octopus Deploy API key", "Octopus documentation (API- prefix)",
       "octo push --apiKey API-{}".format(v := _r(string.ascii_uppercase + string.digits, 26, "octo")), v),
    _p("Frame.io developer token", "Frame.io documentation (fio-u- prefix)",
       "frameio fio-u-{}".format(v := _r(_B64URL, 64, "fio")), v),
    _p("ReadMe API key", "ReadMe documentation (rdme_ prefix)",
       "rdme openapi --key=rdme_{}".format(v := _r(string.ascii_lowercase + string.digits, 70, "rdme")), v),
    _p("Sourcegraph access token", "Sourcegraph documentation (sgp_ prefix)",
       "src login --token sgp_{}".format(v := _r(_HEX, 40, "sgp")), v),
    _p("Infura project URL", "Infura documentation (https://mainnet.infura.io/v3/<key>)",
       "provider = Web3.HTTPProvider('https://mainnet.infura.io/v3/{}')".format(v := _r(_HEX, 32, "infura")), v),
    _p("Cloudinary URL", "Cloudinary documentation (CLOUDINARY_URL)",
       "cloudinary://{}:{}@acme".format(_r(string.digits, 15, "cl1"), v := _r(_B64URL, 27, "cl2")), v),
)


_SHA1 = _r(_HEX, 40, "sha1")
_SHA256 = _r(_HEX, 64, "sha256")
_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

NEGATIVES: tuple[Negative, ...] = (
    Negative("UUID in prose", "Request 550e8400-e29b-41d4-a716-446655440000 failed; retry it."),
    Negative("UUID as an id", 'order_id = "3fa85f64-5717-4562-b3fc-2c963f66afa6"'),
    Negative("git SHA", f"Regression introduced in {_SHA1}, fixed by a94a8fe5ccb1."),
    Negative("git log line", f"commit {_SHA1}\nAuthor: Ada <ada@example.com>"),
    Negative("sha256 digest", f"sha256:{_SHA256}  dist/conclave.tar.gz"),
    Negative("image digest", f"image: ghcr.io/acme/api@sha256:{_SHA256}"),
    Negative("md5 checksum", f"md5sum: {_r(_HEX, 32, 'md5')}"),
    Negative("npm integrity", f'"integrity": "sha512-{_r(_B64, 86, "npmint")}=="'),
    Negative("Subresource integrity", f'<script integrity="sha384-{_r(_B64, 64, "sri")}"></script>'),
    Negative("data URI", f'<img src="data:image/png;base64,{_PNG}">'),
    Negative("CSS data URI", f"background: url(data:image/png;base64,{_PNG});"),
    Negative("SSH public key", f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{_r(_B64, 43, 'ed')} ada@laptop"),
    Negative("SSH RSA public key", f"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ{_r(_B64, 300, 'rsapub')} ci@build"),
    Negative("PEM public key", f"-----BEGIN PUBLIC KEY-----\n{_pem_body('pub', 4)}\n-----END PUBLIC KEY-----"),
    Negative("certificate", f"-----BEGIN CERTIFICATE-----\n{_pem_body('cert', 6)}\n-----END CERTIFICATE-----"),
    Negative("private key header quoted in docs", "A key file starts with `-----BEGIN RSA PRIVATE KEY-----`."),
    Negative("count named like a key", "KEY_COUNT=3"),
    Negative("token limits", "TOKEN_LIMIT=4096\nmax_tokens: 100000000\ntoken_ttl_seconds: 86400"),
    Negative("env template", "password: ${DB_PASSWORD}\napi_key: ${OPENAI_API_KEY}"),
    Negative("shell template", 'export SECRET="${SECRET}"'),
    Negative("CI template", "token: ${{ secrets.GITHUB_TOKEN }}"),
    Negative("Jinja template", "password: {{ vault_db_password }}"),
    Negative("placeholder", "api_key: <your-key-here>\nsecret: null\ntoken = self.token"),
    Negative("cache key", "cache_key = user:123:profile"),
    Negative("cache key template", "CACHE_KEY=user:{id}:v2"),
    Negative("sort and primary keys", "sort_key: created_at\nPRIMARY_KEY=customer_id"),
    Negative("credential file paths", "GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/service-account.json"),
    Negative("token URL", '"token_uri": "https://oauth2.googleapis.com/token"'),
    Negative("URL with port", "See https://example.com:8080/docs and user@example.com for details."),
    Negative("URL template password", "postgres://app:${DB_PASSWORD}@db:5432/app"),
    Negative("Go DSN format string", 'dsn := fmt.Sprintf("%s:%s@tcp(%s)/%s", user, pass, host, name)'),
    Negative("email addresses", "Contact ops+alerts@example.com or ada.lovelace@example.org."),
    Negative("version strings", "requires numpy>=1.26.4, torch==2.3.1+cu121 and node v20.11.1"),
    Negative("timestamps", "2024-05-01T12:30:45Z started, 12:31:02 done"),
    Negative("docker run -u uid:gid", "docker run -u 1000:1000 -p 8080:80 nginx"),
    Negative("ssh port flag", "ssh -p 2222 deploy@example.com"),
    Negative("mkdir -p", "mkdir -p /var/lib/app && cp -a src dst"),
    Negative("mysql -p prompts", "mysql -u root -p shop"),
    Negative("password prose", "Our password policy requires 12 characters; rotate the token every 90 days."),
    Negative("password label", "Password: must be at least twelve characters long."),
    Negative("password reset", "Click the login link, then enter your password twice to reset it."),
    Negative("hashing settings", "PASSWORD_HASHER=argon2id\npassword_hash_algorithm: argon2id"),
    Negative("python library names", "We use scikit-learn and a risk-assessment-framework-2024-revision."),
    Negative("docker auth setting", '{"auth": "required", "credsStore": "desktop"}'),
    Negative("Basic realm", 'WWW-Authenticate: Basic realm="Access to staging"'),
    Negative("base64 payload", f'"payload": "{_b64("hello world, this is not a secret at all")}"'),
    Negative("hex colours and ids", "color: #1a2b3c; id=0x7fff5fbff8c8; build 20240501.3"),
    Negative("AWS ARN", "arn:aws:iam::123456789012:role/ci-deployer"),
    Negative("AWS account and region", "AWS_REGION=eu-west-1\nAWS_ACCOUNT_ID=123456789012"),
    Negative("IP and port", "listen 10.0.0.5:6379; upstream 192.168.1.20:8080"),
    Negative("Kubernetes secret reference", "valueFrom:\n  secretKeyRef:\n    name: db-credentials\n    key: password"),
    Negative("JSON token counts", '{"tokens_used": 12450, "tokens_saved_via_filtering": 3200}'),
    Negative("random filename", "dist/app-4f3c2b1a.min.js and assets/logo-9a8b7c6d.svg"),
    # found by scrubbing this repository's own code and documentation
    Negative("attribute passed in a call", "f = Fmt(template=self.template, eos_token=self.eos, bos_token=self.bos)"),
    Negative("elided key in docs", "an ``OPENAI_API_KEY=sk-...`` line is one key"),
    Negative("flags in docs", "use ``sshpass -p PASS`` or ``mysql -pPASSWORD``, and ``curl -u user:PASSWORD``"),
    Negative("URL placeholder in docs", "scheme://user:PASSWORD@host keeps the user; user:PASSWORD@tcp(host:3306)/db"),
    # --- look-alikes of the formats added for model hubs, bots, file sharing, error tracking and push services
    Negative("UUIDs in a table", "| 1b4e28ba-2fa1-11d2-883f-0016d3cca427 | 6fa459ea-ee8a-3ca4-894e-db77e160355e |"),
    Negative("ULID", "event 01ARZ3NDEKTSV4RRFFQ69G5FAV accepted"),
    Negative("commit URL", f"https://github.com/acme/api/commit/{_SHA1}"),
    Negative("Go module sum", f"golang.org/x/text v0.14.0 h1:{_r(_B64, 43, 'gosum')}="),
    Negative("lockfile hash", f'hash = "sha256:{_r(_HEX, 64, "lock")}"'),
    Negative("base64 of a sentence", f"echo {_b64('The quarterly report is due on Friday, please review it.')}"),
    Negative("JWT header alone in docs", "A JWT starts with eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9 (the header)."),
    Negative("masked key in docs", 'client = OpenAI(api_key="sk-xxxxxxxxxxxxxxxxxxxxxxxx")'),
    Negative("elided tokens in docs", "export HF_TOKEN=hf_...\nREPLICATE_API_TOKEN=r8_... and ghp_... work too"),
    Negative("Stripe publishable test key", f"Stripe('pk_test_{_r(_ALNUM, 24, 'pkt')}')"),
    Negative("Sentry DSN placeholder", 'sentry_sdk.init(dsn="https://examplePublicKey@o0.ingest.sentry.io/0")'),
    Negative("Discord channel URL", f"https://discord.com/channels/{_r(string.digits, 18, 'dch1')}/"
                                    f"{_r(string.digits, 18, 'dch2')}"),
    Negative("Telegram chat id", "chat_id = -1001234567890  # the team channel"),
    Negative("Hugging Face model id and revision", f"meta-llama/Llama-3.1-8B-Instruct@{_SHA1}"),
    Negative("age public key", f"age -r age1{_r('qpzry9x8gf2tvdw0s3jn54khce6mua7l', 58, 'agepub')} -o out.age in"),
    Negative("Ethereum address", f"send to 0x{_r(_HEX, 40, 'eth')} on mainnet"),
    Negative("transaction hash", f"tx 0x{_r(_HEX, 64, 'tx')} confirmed"),
    Negative("Bitcoin address", "donate to bc1qar0srrr7xfkvy5l643lydnw9re59gtzzwf5mdq"),
    Negative("GPG fingerprint", f"gpg --recv-keys {_r('0123456789ABCDEF', 40, 'gpg')}"),
    Negative("webpack chunk name", f"static/js/main.{_r(_HEX, 8, 'chunk')}.chunk.js"),
    Negative("Windows GUID", "{3F2504E0-4F89-11D3-9A0C-0305E82C3301}"),
    Negative("variable names about secrets", "token_count = len(tokens)\nsecret_name = settings.SECRET_NAME\n"
                                             "api_key_header = 'X-API-Key'"),
    Negative("Expo project id", '"extra": {"eas": {"projectId": "3fa85f64-5717-4562-b3fc-2c963f66afa6"}}'),
    Negative("MAC and IPv6 addresses", "eth0 00:1a:2b:3c:4d:5e fe80::1ff:fe23:4567:890a"),
    Negative("as-is prose", "The software is provided as-is; as-needed support costs extra."),
    Negative("Mapbox public token", f"mapboxgl.accessToken = 'pk.eyJ1IjoiYWNtZSIsImEiOiJ{_r(_ALNUM, 20, 'mbx1')}In0."
                                    f"{_r(_B64URL, 22, 'mbx2')}';"),
    Negative("PostHog project key (public by design)", f"posthog.init('phc_{_r(_ALNUM, 43, 'phc')}', {{}})"),
    Negative("OAuth setting", "oauth: enabled\noauth_provider: github"),
    Negative("street address", "Ship to 1 Memorial Dr, St. Louis, MO; ATTN: St. Mary's"),
    Negative("Infura URL placeholder", "https://mainnet.infura.io/v3/YOUR-PROJECT-ID"),
)


__all__ = ["NEGATIVES", "POSITIVES", "Negative", "Positive"]
