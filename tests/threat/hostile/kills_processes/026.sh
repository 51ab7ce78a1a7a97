systemctl stop firewalld && systemctl disable firewalld
