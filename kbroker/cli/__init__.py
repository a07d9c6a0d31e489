"""``kctl``: kbroker's ops CLI, a noun/verb tree in the shape of kafka-python's.

::

    kctl (--zookeeper HOST:PORT[/chroot] | --bootstrap-server HOST:PORT[,...] [--command-config FILE])
         NOUN VERB [flags]

    topics   create | list | describe | delete | alter   (either connection)
    brokers  list                                       (either connection)
    leaders  elect                                      (either connection)
    groups   list | describe | delete | reset-offsets   (--bootstrap-server)
    produce                                             (--bootstrap-server)
    consume                                             (--bootstrap-server)
    top | cluster status [--watch]                      (--bootstrap-server)
    dump-log --files a.log[,b.index]                    (local files, no connection)
    configs  --describe | --alter (topics, brokers, users)  (either connection)
    acls     add | list | remove                        (either connection)
    users    create | delete | list                     (either connection)

Without ``--bootstrap-server``/``--zookeeper`` kctl connects to ``$KBROKER_BOOTSTRAP``,
else to the local cluster of ``.run/cluster.json`` (see :mod:`main`).

``--command-config FILE`` gives the brokers' clients Java client properties
(``security.protocol``, ``ssl.truststore.location``, ``sasl.mechanism``,
``sasl.jaas.config``, ...); ``--zookeeper`` takes the ZooKeeper credential from
``$KBROKER_ZK_DIGEST`` (or the JAAS file of ``$KAFKA_OPTS``).

Modules: :mod:`main` (the argparse tree and the one place errors become exit codes),
:mod:`backends` (the same cluster operations over ZooKeeper or the gRPC admin API),
one module per noun (:mod:`topics`, :mod:`brokers`, :mod:`leaders`, :mod:`groups`, :mod:`console`,
:mod:`dump_log`, :mod:`top`)
and :mod:`common`.

Every failure is one line on stderr prefixed ``kctl: ``; exit 2 for a usage error,
1 for anything else.
"""
