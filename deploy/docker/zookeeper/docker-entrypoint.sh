#!/usr/bin/env bash
# Writes $ZOO_CONF_DIR/zoo.cfg from the environment, as the official zookeeper image does,
# unless a zoo.cfg was mounted there, then runs the server in the foreground.
#   ZOO_MY_ID      this server's id (written to $ZOO_DATA_DIR/myid; default 1)
#   ZOO_SERVERS    the ensemble, "server.1=zk1:2888:3888;2181 server.2=zk2:2888:3888;2181 ..."
#                  (unset: a standalone server)
#   ZOO_TICK_TIME, ZOO_INIT_LIMIT, ZOO_SYNC_LIMIT, ZOO_MAX_CLIENT_CNXNS, ZOO_STANDALONE_ENABLED,
#   ZOO_ADMINSERVER_ENABLED, ZOO_AUTOPURGE_PURGEINTERVAL, ZOO_AUTOPURGE_SNAPRETAINCOUNT,
#   ZOO_4LW_COMMANDS_WHITELIST   the zoo.cfg keys of those names
#   ZOO_CFG_EXTRA  more zoo.cfg lines, space-separated ("key=value key=value")
#   JVMFLAGS       options for java
set -euo pipefail
if [[ ${1:-} != zkServer ]]; then exec "$@"; fi

cfg=$ZOO_CONF_DIR/zoo.cfg
if [[ ! -f $cfg ]]; then
    {
        echo "dataDir=$ZOO_DATA_DIR"
        echo "dataLogDir=$ZOO_DATA_LOG_DIR"
        echo "tickTime=$ZOO_TICK_TIME"
        echo "initLimit=$ZOO_INIT_LIMIT"
        echo "syncLimit=$ZOO_SYNC_LIMIT"
        echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
        echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
        echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
        echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
        echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
        echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST"
        if [[ -n ${ZOO_SERVERS:-} ]]; then
            for server in $ZOO_SERVERS; do echo "$server"; done
        else
            echo "clientPort=2181"
        fi
        for line in ${ZOO_CFG_EXTRA:-}; do echo "$line"; done
    } >"$cfg"
fi
if [[ ! -f $ZOO_DATA_DIR/myid ]]; then
    echo "${ZOO_MY_ID:-1}" >"$ZOO_DATA_DIR/myid"
fi

log4j=$ZOO_CONF_DIR/log4j.properties
[[ -f $log4j ]] || log4j=/etc/zookeeper-image/log4j.properties
cp=$ZOO_CONF_DIR:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar
# shellcheck disable=SC2086  # JVMFLAGS is a list of options
exec java ${JVMFLAGS:-} -Dlog4j.configuration="file:$log4j" -Dzookeeper.root.logger=INFO,CONSOLE \
    -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$cfg"
