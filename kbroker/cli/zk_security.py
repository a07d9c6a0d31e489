"""``kctl zookeeper-security-migration``: set or remove the ACLs of every kbroker znode,
as Kafka's ``zookeeper-security-migration.sh`` (``ZkSecurityMigrator``)::

    KBROKER_ZK_DIGEST=kafka:secret kctl zookeeper-security-migration \\
        --zookeeper.connect zk1:2181/kbroker --zookeeper.acl secure

``secure`` gives ``/`` (the chroot) and every znode under kbroker's root paths
(:data:`kbroker.cluster.zkdata.SECURE_ROOT_PATHS`) ALL for the credential and READ for
world, no world READ on the sensitive paths; ``unsecure`` gives them world ALL again.
Both need the ZooKeeper credential (``$KBROKER_ZK_DIGEST`` or a JAAS ``Client`` section
named in ``$KAFKA_OPTS``), as Kafka's tool needs a JAAS file: changing an ACL takes the
ADMIN permission, which the secured tree grants to that identity only.

Output: ``Set secure ACLs on N znodes under CONNECT`` (stdout). Paths that every broker
creates at start-up but are missing (a wrong chroot?) are named on stderr; with
``--enable.path.check`` that is a failure, nothing being changed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kbroker.cli.backends import connect_zookeeper, zookeeper_credential
from kbroker.cli.common import CliError, UsageError, check_zookeeper
from kbroker.cluster import zk_acl_migration
from kbroker.cluster.zk_errors import ZooKeeperNoAuthError
from kbroker.security.zk_credential import DIGEST_ENV, JAAS_PROPERTY, KAFKA_OPTS_ENV, NO_AUTH_HINT, no_auth_message

NOUN = "zookeeper-security-migration"


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser(
        NOUN,
        parents=[connection],
        help="set or remove the ZooKeeper ACLs of kbroker's znodes (zookeeper-security-migration.sh)",
        description="Make every kbroker znode secure (ALL for the ZooKeeper credential, READ for world"
        " except credentials) or unsecure (world ALL). The credential comes from"
        f" ${DIGEST_ENV}=USER:PASSWORD or ${KAFKA_OPTS_ENV}=-D{JAAS_PROPERTY}=FILE.",
    )
    p.add_argument(
        "--zookeeper.connect",
        dest="zookeeper_connect",
        metavar="HOST:PORT[/chroot]",
        help="the ZooKeeper ensemble and kbroker's chroot (or give --zookeeper)",
    )
    p.add_argument(
        "--zookeeper.acl",
        dest="zookeeper_acl",
        required=True,
        choices=("secure", "unsecure"),
        help="secure: ACLs for the credential; unsecure: world ALL",
    )
    p.add_argument(
        "--zookeeper.session.timeout",
        dest="zookeeper_session_timeout",
        type=int,
        default=30000,
        metavar="MS",
        help="ZooKeeper session timeout (default 30000)",
    )
    p.add_argument(
        "--enable.path.check",
        dest="enable_path_check",
        action="store_true",
        help="fail, changing nothing, if kbroker's root paths are missing (a wrong chroot?)",
    )
    p.set_defaults(handler=run_migration)


def _connect_string(args: argparse.Namespace) -> str:
    given = args.zookeeper_connect or getattr(args, "zookeeper", None)
    if getattr(args, "bootstrap_server", None):
        raise UsageError(f"{NOUN} works on ZooKeeper: give --zookeeper.connect, not --bootstrap-server")
    if not given:
        raise UsageError(f"{NOUN} needs --zookeeper.connect HOST:PORT[/chroot]")
    return check_zookeeper(given)


def run_migration(args: argparse.Namespace) -> int:
    connect = _connect_string(args)
    if args.zookeeper_session_timeout <= 0:
        raise UsageError("--zookeeper.session.timeout must be positive")
    secure = args.zookeeper_acl == "secure"
    credential = zookeeper_credential()
    if credential is None:
        raise CliError(f"{NOUN} needs the ZooKeeper credential: {NO_AUTH_HINT}")
    zk = connect_zookeeper(
        connect, credential=credential, set_acl=secure, session_timeout_ms=args.zookeeper_session_timeout
    )
    try:
        missing = zk_acl_migration.missing_roots(zk)
        if missing:
            note = f"these kbroker paths do not exist under {connect}: {', '.join(missing)} (a wrong chroot?)"
            if args.enable_path_check:
                raise CliError(note)
            print(f"kctl: warning: {note}", file=sys.stderr)
        try:
            count = zk_acl_migration.migrate(zk, credential if secure else None)
        except ZooKeeperNoAuthError:
            raise CliError(no_auth_message(credential)) from None
    finally:
        zk.close()
    print(f"Set {args.zookeeper_acl} ACLs on {count} znodes under {connect}")
    return 0
